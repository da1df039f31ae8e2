"""Lowering: one decode step of a ModelSpec at a position, with a KV cache, into a Schedule (task DAG).

``lower(model, config, gpu, position)`` is deterministic. The task list is built in topological order,
so every SM queue (its tasks in list order) is a linear extension of the DAG. Every stage of the step
signals its own counter and every consumer waits on it with threshold = number of producers (all-join).
KV appends are ordered before the attention reads of the same step by waits on the append counters.
Row-split tasks carry ``ranges`` (rows of axis 0 they touch) so writers of disjoint rows do not conflict.

Prefill is done token by token: the ReferenceVM runs the decode-step schedule at positions 0..n-1 of
the prompt (each step appends its K/V and attends over the cache), then keeps decoding. See docs/amk.md.
"""

from __future__ import annotations

import heapq
from collections.abc import Sequence
from typing import Any

import attrs
import numpy as np
from mosaic.errors import BadInput
from mosaic.records import GpuTarget

from mosaic_amk import rope_order
from mosaic_amk.config import AUTO_APART_MAX_WEIGHTS_PER_SM, ScheduleConfig
from mosaic_amk.footprints import split_range
from mosaic_amk.model import INV_FREQ, ModelSpec
from mosaic_amk.ops import OP_SPECS
from mosaic_amk.schedule import Buffer, PageFill, PagePool, Schedule, Task, TaskPages, Wait, row_bytes

TOKEN = "token"
LOGITS = "logits"
NEXT_TOKEN = "next_token"


def k_cache(layer: int) -> str:
    return f"kv.{layer}.k"


def v_cache(layer: int) -> str:
    return f"kv.{layer}.v"


def kv_capacity(model: ModelSpec, config: ScheduleConfig) -> int:
    """Tokens the KV cache holds: kv_max_tokens, or max_position_embeddings rounded up to a page."""
    page = config.kv_page_tokens
    return config.kv_max_tokens or -(-model.max_position_embeddings // page) * page


def qkv_sms(qd: int, kvd: int, num_sms: int) -> tuple[list[int], list[int], list[int]]:
    """The SMs of the q, k and v GEMVs of one layer with ``rope_order`` blocked and the balanced split: consecutive
    SM ranges in proportion to their rows (q: qd, k and v: kvd each), at least one SM each and at most one per
    unit (an 8-row block for q and k, a row for v), so the three GEMVs run one task per SM. Fewer than 3 SMs:
    every GEMV over all of them."""
    if num_sms < 3:
        every = list(range(num_sms))
        return every, every, every
    total = qd + 2 * kvd
    n_k = max(1, min(kvd // rope_order.BLOCK, round(num_sms * kvd / total)))
    n_q = max(1, min(qd // rope_order.BLOCK, num_sms - 2 * n_k, round(num_sms * qd / total)))
    n_v = max(1, min(kvd, num_sms - n_q - n_k))
    return (list(range(n_q)), list(range(n_q, n_q + n_k)), list(range(n_q + n_k, n_q + n_k + n_v)))


def apart(placement: str, attention_tasks: int, num_sms: int, o_weights: int) -> bool:
    """Whether a layer's attention tasks go on the last SMs, its o-projection (``o_weights`` weights) over the others:
    ``attention_placement`` apart, or auto and the o-projection small enough (config.AUTO_APART_MAX_WEIGHTS_PER_SM)."""
    if attention_tasks >= num_sms or placement not in ("apart", "auto"):
        return False
    return placement == "apart" or o_weights <= AUTO_APART_MAX_WEIGHTS_PER_SM * (num_sms - attention_tasks)


class _Builder:
    def __init__(self, model: ModelSpec, config: ScheduleConfig, num_sms: int):
        self.model, self.config, self.num_sms = model, config, num_sms
        self.buffers: dict[str, Buffer] = {}
        self.tasks: list[Task] = []
        self.producers: list[int] = []  # per counter: how many tasks signal it
        self.load = [(0, sm) for sm in range(num_sms)]  # least_loaded heap: (bytes, sm)
        self.pins: list[int] = []  # SMs of the next tasks, before the policy (attention_placement "apart")

    # buffers ---------------------------------------------------------------------------------------
    def weight(self, name: str) -> str:
        if name not in self.buffers:
            blocked = rope_order.split_name(name)  # the checkpoint tensor, rows permuted when bound
            w = self.model.weights.get(blocked[0] if blocked else name)
            if w is None:
                raise BadInput(f"model has no weight {name}")
            dtype = "f32" if isinstance(w, np.ndarray) else w.format  # a quant.QuantizedTensor: its format
            self.buffers[name] = Buffer(name, dtype, tuple(w.shape), "weight")
        return name

    def buf(self, name: str, shape: tuple, kind: str = "activation", dtype: str = "f32") -> str:
        self.buffers[name] = Buffer(name, dtype, tuple(shape), kind)
        return name

    # counters and tasks ----------------------------------------------------------------------------
    def counter(self) -> int:
        self.producers.append(0)
        return len(self.producers) - 1

    def join(self, counter: int) -> Wait:
        return Wait(counter, self.producers[counter])

    def _sm(self, cost: int) -> int:
        if self.pins:
            return self.pins.pop(0)
        policy = self.config.sm_policy
        if policy == "single":
            return 0
        if policy == "round_robin":
            return len(self.tasks) % self.num_sms
        used, sm = heapq.heappop(self.load)
        heapq.heappush(self.load, (used + max(cost, 1), sm))
        return sm

    def task(self, op: str, inputs: list[str], outputs: list[str], waits: list[Wait], signal: int,
             params: dict[str, Any], ranges: dict[str, tuple[int, int]] | None = None, cost: int = 0) -> None:
        spec = OP_SPECS[op]
        assert len(inputs) == len(spec.input_roles(params)) and len(outputs) == len(spec.outputs), op
        self.tasks.append(Task(id=len(self.tasks), op=op, sm=self._sm(cost), inputs=tuple(inputs),
                               outputs=tuple(outputs), waits=tuple(waits), signal=signal, params=params,
                               ranges=ranges or {}))
        self.producers[signal] += 1

    def norm_input(self, x: str, c_x: int, norm_weight: str, out_name: str) -> tuple[str, int, tuple | None]:
        """The input of the GEMVs that consume rmsnorm(x): with the ``rmsnorm_gemv`` fusion x itself, its counter and
        (norm weight, eps) for each GEMV task to normalise x; otherwise an ``rmsnorm`` task writing ``out_name`` (its
        counter, no norm for the GEMVs)."""
        eps = self.model.rms_norm_eps
        if "rmsnorm_gemv" in self.config.fusion:
            return x, c_x, (norm_weight, eps)
        xn = self.buf(out_name, (self.model.hidden_size,))
        c_xn = self.counter()
        self.task("rmsnorm", [x, norm_weight], [xn], [self.join(c_x)], c_xn, {"eps": eps},
                  cost=self.model.hidden_size * 8)
        return xn, c_xn, None

    def row_ranges(self, n_out: int, rows_per_task: int, unit: int = 1, balanced: bool | None = None,
                   sms: int = 0) -> list[tuple[int, int]]:
        """The row ranges of one GEMV's tasks. ``rows`` split: ``rows_per_task`` rows each (rounded down to whole
        units, at least one unit), the last range shorter. ``balanced`` split: ``min(sms or num_sms, units)`` ranges
        of whole units whose sizes differ by at most one unit (the larger ones first), so a GEMV stage runs one task
        per SM under round-robin placement."""
        if balanced is None:
            balanced = self.config.gemv_split == "balanced"
        if not balanced:
            step = max(unit, rows_per_task // unit * unit)
            return [(r0, min(n_out, r0 + step)) for r0 in range(0, n_out, step)]
        units = -(-n_out // unit)
        tasks = max(1, min(sms or self.num_sms, units))
        base, extra = divmod(units, tasks)
        out, u0 = [], 0
        for k in range(tasks):
            u1 = u0 + base + (1 if k < extra else 0)
            out.append((u0 * unit, min(n_out, u1 * unit)))
            u0 = u1
        return out

    def gemv(self, x: str, weight: str, bias: str | None, out: str, waits: list[Wait], signal: int,
             rows_per_task: int, residual: str | None = None, norm: tuple[str, float] | None = None,
             balanced: bool | None = None, sms: Sequence[int] = ()) -> None:
        """Row-split GEMV: out[r0:r1] = (residual[r0:r1] +) W[r0:r1] @ x (+ b[r0:r1]); with ``norm`` =
        (norm weight, eps) each task normalises x itself (``rmsnorm_gemv``). ``sms``: place the tasks on these SMs in
        turn (the balanced split cut into at most len(sms) tasks) instead of by the policy."""
        n_out, n_in = self.buffers[weight].shape
        ranges_ = self.row_ranges(n_out, rows_per_task, balanced=balanced, sms=len(sms))
        if sms:
            self.pins = [sms[k % len(sms)] for k in range(len(ranges_))]
        for r0, r1 in ranges_:
            rest = [weight] + ([bias] if bias else []) + ([residual] if residual else [])
            ranges = {n: (r0, r1) for n in rest}
            ranges[out] = (r0, r1)
            params = {"row_start": r0, "row_end": r1, "bias": bool(bias), "residual": bool(residual)}
            if norm:
                self.task("rmsnorm_gemv", [x, norm[0], *rest], [out], waits, signal, {**params, "eps": norm[1]},
                          ranges, cost=(r1 - r0) * n_in * 4)
            else:
                self.task("gemv", [x, *rest], [out], waits, signal, params, ranges, cost=(r1 - r0) * n_in * 4)

    def gemv_rope(self, op: str, x: str, weight: str, bias: str | None, out: str, waits: list[Wait], signal: int,
                  rows_per_task: int, norm: tuple[str, float] | None, rope: dict, inv_freq: str | None,
                  page_tokens: int = 0, sms: Sequence[int] = ()) -> None:
        """``gemv_rope`` (rows of out, whole heads) or ``gemv_rope_append`` (columns of the KV slot). With
        ``rope_order`` blocked the RoPE rows are cut in whole 8-row blocks (``rope_block``) and the rows without RoPE
        (v) in rows; ``sms``: the tasks on these SMs (the balanced split cut into at most len(sms) tasks)."""
        n_out, n_in = self.buffers[weight].shape
        hd = rope["head_dim"]
        position = rope["position"]
        blocked = self.config.rope_order == "blocked"
        unit = (rope_order.BLOCK if inv_freq else 1) if blocked else hd
        ranges_ = self.row_ranges(n_out, rows_per_task, unit=unit, sms=len(sms))
        if sms:
            self.pins = [sms[k % len(sms)] for k in range(len(ranges_))]
        for r0, r1 in ranges_:
            extra = ([inv_freq] if inv_freq else []) + ([norm[0]] if norm else []) + ([bias] if bias else [])
            ranges = {weight: (r0, r1)}
            if bias:
                ranges[bias] = (r0, r1)
            params = {"row_start": r0, "row_end": r1, "bias": bool(bias), "norm": bool(norm),
                      "eps": norm[1] if norm else 0.0, "position": position, "head_dim": hd,
                      "attention_scaling": rope["attention_scaling"]}
            if blocked and inv_freq:
                params["rope_block"] = rope_order.BLOCK
            if op == "gemv_rope_append":
                page = position // page_tokens
                params.update(rope=bool(inv_freq), page_tokens=page_tokens)
                ranges[out] = (page, page + 1)
            else:
                ranges[out] = (r0, r1)
            self.task(op, [x, weight, *extra], [out], waits, signal, params, ranges, cost=(r1 - r0) * n_in * 4)


def lower(model: ModelSpec, config: ScheduleConfig, gpu: GpuTarget, position: int) -> Schedule:
    """The schedule of one decode step at ``position`` (the token's index; the KV cache holds positions
    ``0 .. position-1`` from earlier steps, and this step appends ``position``)."""
    config.for_gpu(gpu)
    capacity = kv_capacity(model, config)
    if not isinstance(position, int) or position < 0 or position >= capacity:
        raise BadInput(f"position {position} outside the KV cache (0 .. {capacity - 1})")
    m, c = model, config
    b = _Builder(m, c, c.sms(gpu))
    fused = set(c.fusion)
    rows = c.gemv_rows_per_task
    page = c.kv_page_tokens
    pages = capacity // page
    h, qd, kvd, hd = m.hidden_size, m.q_dim, m.kv_dim, m.head_dim
    rope = {"position": position, "head_dim": hd, "attention_scaling": m.attention_scaling}
    bias = lambda name: b.weight(name) if name in m.weights else None  # noqa: E731
    inv_freq = b.weight(INV_FREQ)

    b.buf(TOKEN, (1,), "input", "i32")
    emb = b.weight(m.embed_name)
    resid = b.buf("h.0", (h,))
    c_resid = b.counter()
    b.task("embed", [emb, TOKEN], [resid], [], c_resid, {}, cost=h * 4)

    rep, per = m.num_heads // m.num_kv_heads, c.attention_kv_heads_per_task
    qper = c.attention_q_heads_per_task or rep * per  # query heads per attention task (a KV group's, or fewer)
    heads = [(h0 * hd, min(g1 * rep, h0 + qper) * hd)  # the row ranges of the attention tasks (without split_kv)
             for g0 in range(0, m.num_kv_heads, per) for g1 in [min(m.num_kv_heads, g0 + per)]
             for h0 in range(g0 * rep, g1 * rep, qper)]
    blocked = c.rope_order == "blocked"  # q/k rows (weights, biases, outputs) in the blocked RoPE order
    qkv_split = blocked and c.gemv_split == "balanced" and "gemv_rope_append" in fused  # q/k/v share the SMs
    att_apart = "split_kv" not in fused and apart(c.attention_placement, len(heads), b.num_sms, h * qd)
    # the attention tasks on the last SMs: apart, or apart_qkv (auto's other choice), which keeps only the q/k/v
    # blocks off them (the o-projection everywhere; without the q/k/v split it places like round_robin)
    att_pinned = att_apart or (qkv_split and "split_kv" not in fused and len(heads) < b.num_sms
                               and c.attention_placement in ("apart_qkv", "auto"))

    for i in range(m.num_layers):
        lay = lambda n: m.layer(i, n)  # noqa: E731, B023
        # attention block ------------------------------------------------------------------------------
        kc = b.buf(k_cache(i), (pages, page, kvd), "kv_cache")
        vc = b.buf(v_cache(i), (pages, page, kvd), "kv_cache")
        slot = {kc: (position // page, position // page + 1)}
        # rmsnorm_gemv: every consumer of the norm normalises h.i itself
        xn, c_xn, norm = b.norm_input(resid, c_resid, b.weight(lay("input_layernorm.weight")), f"l{i}.attn_norm")
        w_of = {}
        for n in ("q", "k", "v"):
            wn, bn = lay(f"self_attn.{n}_proj.weight"), lay(f"self_attn.{n}_proj.bias")
            has_bias = bn in m.weights
            if blocked and n != "v":  # bound with their rows permuted (rope_order.resolve)
                wn, bn = rope_order.weight_name(wn, hd), rope_order.weight_name(bn, hd)
            w_of[n] = (b.weight(wn), b.weight(bn) if has_bias else None)
        if "gemv_rope_append" in fused:  # q rows rotated in the GEMV; k/v rows written into the KV slot
            qr = b.buf(f"l{i}.q_rope", (qd,))
            c_qr, c_ka, c_va = b.counter(), b.counter(), b.counter()
            # apart: the attention SMs run no q/k/v task either (their KV staging starts with the stage)
            sms = qkv_sms(qd, kvd, b.num_sms - (len(heads) if att_pinned else 0)) if qkv_split else ((), (), ())
            b.gemv_rope("gemv_rope", xn, *w_of["q"], qr, [b.join(c_xn)], c_qr, rows, norm, rope, inv_freq,
                        sms=sms[0])
            b.gemv_rope("gemv_rope_append", xn, *w_of["k"], kc, [b.join(c_xn)], c_ka, rows, norm, rope, inv_freq,
                        page, sms=sms[1])
            b.gemv_rope("gemv_rope_append", xn, *w_of["v"], vc, [b.join(c_xn)], c_va, rows, norm, rope, None, page,
                        sms=sms[2])
        else:
            proj = {}
            for name, dim in (("q", qd), ("k", kvd), ("v", kvd)):
                out = b.buf(f"l{i}.{name}", (dim,))
                cnt = b.counter()
                b.gemv(xn, *w_of[name], out, [b.join(c_xn)], cnt, rows, norm=norm)
                proj[name] = (out, cnt)
            qr = b.buf(f"l{i}.q_rope", (qd,))
            c_qr = b.counter()
            b.task("rope", [proj["q"][0], inv_freq], [qr], [b.join(proj["q"][1])], c_qr,
                   {**rope, "num_heads": m.num_heads}, cost=qd * 4)
            c_ka = b.counter()
            if "rope_append" in fused:
                b.task("rope_append", [proj["k"][0], inv_freq], [kc], [b.join(proj["k"][1])], c_ka,
                       {**rope, "num_heads": m.num_kv_heads, "page_tokens": page}, slot, cost=kvd * 4)
            else:
                kr = b.buf(f"l{i}.k_rope", (kvd,))
                c_kr = b.counter()
                b.task("rope", [proj["k"][0], inv_freq], [kr], [b.join(proj["k"][1])], c_kr,
                       {**rope, "num_heads": m.num_kv_heads}, cost=kvd * 4)
                b.task("kv_append", [kr], [kc], [b.join(c_kr)], c_ka, {"position": position, "page_tokens": page},
                       slot, cost=kvd * 4)
            c_va = b.counter()
            b.task("kv_append", [proj["v"][0]], [vc], [b.join(proj["v"][1])], c_va,
                   {"position": position, "page_tokens": page}, {vc: slot[kc]}, cost=kvd * 4)
        attn = b.buf(f"l{i}.attn", (qd,))
        c_attn = b.counter()
        window = m.window(i)
        first = max(0, position - window + 1) if window else 0
        attn_params = {"position": position, "num_heads": m.num_heads, "num_kv_heads": m.num_kv_heads,
                       "head_dim": hd, "window": window, "scale": hd ** -0.5, "page_tokens": page,
                       **({"rope_block": rope_order.BLOCK} if blocked else {})}
        kv_waits = [b.join(c_qr), b.join(c_ka), b.join(c_va)]
        o_sms: list[int] = []  # attention_placement "apart": the o-projection's SMs
        if "split_kv" in fused:  # flash-decoding: each (head group, KV chunk) a task, then a combine per group
            ns = c.attention_kv_splits
            part = b.buf(f"l{i}.attn_part", (ns, qd), "scratch")
            ml = b.buf(f"l{i}.attn_ml", (ns, m.num_heads, 2), "scratch")
            c_part = b.counter()
            for g0 in range(0, m.num_kv_heads, per):
                g1 = min(m.num_kv_heads, g0 + per)
                r0, r1 = g0 * rep * hd, g1 * rep * hd
                for sp in range(ns):
                    lo, hi = split_range(first, position + 1, sp, ns)
                    rng = {qr: (r0, r1), part: (sp, sp + 1), ml: (sp, sp + 1)}
                    if hi > lo:
                        rng[kc] = rng[vc] = (lo // page, (hi - 1) // page + 1)
                    b.task("attention_partial", [qr, kc, vc], [part, ml], kv_waits, c_part,
                           {**attn_params, "row_start": r0, "row_end": r1, "split": sp, "num_splits": ns}, rng,
                           cost=2 * (hi - lo) * (g1 - g0) * hd * 4)
            for g0 in range(0, m.num_kv_heads, per):
                g1 = min(m.num_kv_heads, g0 + per)
                r0, r1 = g0 * rep * hd, g1 * rep * hd
                b.task("attention_combine", [part, ml], [attn], [b.join(c_part)], c_attn,
                       {"row_start": r0, "row_end": r1, "head_dim": hd, "num_heads": m.num_heads, "num_splits": ns},
                       {attn: (r0, r1)}, cost=ns * (r1 - r0) * 4)
        else:
            kv_pages = (first // page, position // page + 1)
            if att_pinned:
                # the attention tasks on the last SMs, the o-projection below over the others
                o_sms = list(range(b.num_sms - len(heads))) if att_apart else []
                b.pins = list(range(b.num_sms - len(heads), b.num_sms))
            for r0, r1 in heads:
                b.task("attention", [qr, kc, vc], [attn], kv_waits, c_attn,
                       {**attn_params, "row_start": r0, "row_end": r1},
                       {qr: (r0, r1), kc: kv_pages, vc: kv_pages, attn: (r0, r1)},
                       cost=2 * (position + 1 - first) * max(1, (r1 - r0) // (rep * hd)) * hd * 4)
        mid = b.buf(f"l{i}.h_mid", (h,))
        c_mid = b.counter()
        o_w, o_b = b.weight(lay("self_attn.o_proj.weight")), bias(lay("self_attn.o_proj.bias"))
        if "residual" in fused:
            b.gemv(attn, o_w, o_b, mid, [b.join(c_attn)], c_mid, rows, residual=resid, sms=o_sms)
        else:
            o = b.buf(f"l{i}.o", (h,))
            c_o = b.counter()
            b.gemv(attn, o_w, o_b, o, [b.join(c_attn)], c_o, rows, sms=o_sms)
            b.task("add", [resid, o], [mid], [b.join(c_o)], c_mid, {}, cost=h * 12)
        # MLP block --------------------------------------------------------------------------------------
        xn2, c_xn2, norm2 = b.norm_input(mid, c_mid, b.weight(lay("post_attention_layernorm.weight")), f"l{i}.mlp_norm")
        inter = m.intermediate_size
        act = b.buf(f"l{i}.act", (inter,))
        c_act = b.counter()
        wg, wu = b.weight(lay("mlp.gate_proj.weight")), b.weight(lay("mlp.up_proj.weight"))
        bg, bu = bias(lay("mlp.gate_proj.bias")), bias(lay("mlp.up_proj.bias"))
        if "gate_up_silu" in fused:
            for r0, r1 in b.row_ranges(inter, rows):
                rest = [wg, wu] + ([bg, bu] if bg else [])
                rng = {n: (r0, r1) for n in rest}
                rng[act] = (r0, r1)
                params = {"row_start": r0, "row_end": r1, "bias": bool(bg)}
                if norm2:
                    b.task("rmsnorm_gemv_silu_mul", [xn2, norm2[0], *rest], [act], [b.join(c_xn2)], c_act,
                           {**params, "eps": norm2[1]}, rng, cost=2 * (r1 - r0) * h * 4)
                else:
                    b.task("gemv_silu_mul", [xn2, *rest], [act], [b.join(c_xn2)], c_act, params, rng,
                           cost=2 * (r1 - r0) * h * 4)
        else:
            gate, up = b.buf(f"l{i}.gate", (inter,)), b.buf(f"l{i}.up", (inter,))
            c_gu = b.counter()  # shared by the gate and up row tasks: an all-join
            b.gemv(xn2, wg, bg, gate, [b.join(c_xn2)], c_gu, rows, norm=norm2)
            b.gemv(xn2, wu, bu, up, [b.join(c_xn2)], c_gu, rows, norm=norm2)
            b.task("silu_mul", [gate, up], [act], [b.join(c_gu)], c_act, {}, cost=inter * 12)
        nxt = b.buf(f"h.{i + 1}", (h,))
        c_next = b.counter()
        d_w, d_b = b.weight(lay("mlp.down_proj.weight")), bias(lay("mlp.down_proj.bias"))
        if "residual" in fused:
            b.gemv(act, d_w, d_b, nxt, [b.join(c_act)], c_next, rows, residual=mid)
        else:
            d = b.buf(f"l{i}.down", (h,))
            c_d = b.counter()
            b.gemv(act, d_w, d_b, d, [b.join(c_act)], c_d, rows)
            b.task("add", [mid, d], [nxt], [b.join(c_d)], c_next, {}, cost=h * 12)
        resid, c_resid = nxt, c_next

    # final norm, LM head, argmax --------------------------------------------------------------------------
    xf, c_xf, norm_f = b.norm_input(resid, c_resid, b.weight("model.norm.weight"), "final_norm")
    logits = b.buf(LOGITS, (m.vocab_size,), "output")
    c_logits = b.counter()
    b.gemv(xf, b.weight(m.lm_head_name), None, logits, [b.join(c_xf)], c_logits, c.lm_head_rows_per_task or rows,
           norm=norm_f, balanced=None if not c.lm_head_rows_per_task else False)
    nt = b.buf(NEXT_TOKEN, (1,), "output", "i32")
    if "split_argmax" in fused:  # per-chunk max and first index, then the first index of the max of those
        step = c.argmax_rows_per_task
        parts = -(-m.vocab_size // step)
        val = b.buf("argmax_val", (parts,), "scratch")
        idx = b.buf("argmax_idx", (parts,), "scratch", "i32")
        c_part = b.counter()
        for k, r0 in enumerate(range(0, m.vocab_size, step)):
            r1 = min(m.vocab_size, r0 + step)
            b.task("argmax_partial", [logits], [val, idx], [b.join(c_logits)], c_part,
                   {"row_start": r0, "row_end": r1, "part": k}, {logits: (r0, r1), val: (k, k + 1), idx: (k, k + 1)},
                   cost=(r1 - r0) * 4)
        b.task("argmax_combine", [val, idx], [nt], [b.join(c_part)], b.counter(), {}, cost=parts * 8)
    else:
        b.task("argmax", [logits], [nt], [b.join(c_logits)], b.counter(), {}, cost=m.vocab_size * 4)

    meta = {"model": m.family, "layers": m.num_layers, "position": position, "gpu": gpu.name,
            "kv_capacity": capacity, "config": c.to_json()}
    tasks, pools = tuple(b.tasks), ()
    if c.pages:
        tasks, pools = page_protocol(tasks, b.buffers, b.num_sms, c.pages, c.page_bytes)
    return Schedule(num_sms=b.num_sms, buffers=tuple(b.buffers.values()), num_counters=len(b.producers),
                    tasks=tasks, outputs=(LOGITS, NEXT_TOKEN), meta=meta, page_pools=pools)


# ops whose tasks stream rows of one weight (the first weight operand with a ranges entry): the page protocol's
# GEMV family
GEMV_FAMILY = frozenset(("gemv", "rmsnorm_gemv", "gemv_silu_mul", "rmsnorm_gemv_silu_mul", "gemv_rope",
                         "gemv_rope_append"))


def _page_rows(t: Task, buffers: dict[str, Buffer], page_bytes: int) -> tuple[str, int, int] | None:
    """(weight, first row, end row) of a GEMV-family task's prefetch: its first rows of its row-split weight that fit
    one page; None for another op, or when one row does not fit."""
    if t.op not in GEMV_FAMILY:
        return None
    for name in t.inputs:
        buf = buffers.get(name)
        if buf is not None and buf.kind == "weight" and name in t.ranges:
            r0, r1 = t.ranges[name]
            fit = page_bytes // row_bytes(buf.dtype, buf.shape)
            return (name, r0, r0 + min(r1 - r0, fit)) if fit >= 1 else None
    return None


def page_protocol(tasks: tuple[Task, ...], buffers: dict[str, Buffer], num_sms: int, pages: int, page_bytes: int
                  ) -> tuple[tuple[Task, ...], tuple[PagePool, ...]]:
    """The page protocol for the GEMV-family tasks (``ScheduleConfig.pages``; docs/amk-schedule.md "Pages").

    Every SM gets a pool of ``pages`` pages. On each SM, the k-th GEMV-family task ``g_k`` (queue order) whose first
    weight row fits a page gets page ``k mod pages`` (a ring): the loader fills it with the task's first weight rows
    that fit, ``g_k`` reads them from the page and releases it after it runs. The fill is acquired ahead: a page
    never used before at ``g_{k - pages + 1}`` (the first GEMV task for the first ones: the loader starts at
    launch), else at the first task of the queue after the page's previous reader ``R`` that comes after every
    producer of ``R``'s counter in the list, with an all-join wait on that counter (so the refill is ordered after
    ``R`` released it); when no task up to ``g_k`` qualifies, ``g_k`` takes no page. Weights are valid at launch,
    so the fills wait on nothing else."""
    prods: dict[int, list[int]] = {}
    queues: dict[int, list[int]] = {}
    for i, t in enumerate(tasks):
        prods.setdefault(t.signal, []).append(i)
        queues.setdefault(t.sm, []).append(i)
    acquire: dict[int, list[PageFill]] = {}
    use: dict[int, list[int]] = {}
    for q in queues.values():
        pos = {i: k for k, i in enumerate(q)}
        gemvs = [(i, got) for i in q if (got := _page_rows(tasks[i], buffers, page_bytes)) is not None]
        released: list[int | None] = [None] * pages  # per page: the task that last released it
        for k, (g, (w, r0, r1)) in enumerate(gemvs):
            p = k % pages
            prev = released[p]
            if prev is None:
                at, waits = gemvs[max(0, k - pages + 1)][0], ()
            else:
                c = tasks[prev].signal
                last = prods[c][-1]
                at = next((j for j in q[pos[prev] + 1:pos[g] + 1] if j > last), None)
                if at is None:
                    continue  # no task can acquire it in time: g_k reads global memory
                waits = (Wait(c, len(prods[c])),)
            acquire.setdefault(at, []).append(PageFill(p, w, (r0, r1), waits))
            use.setdefault(g, []).append(p)
            released[p] = g
    out = tuple(attrs.evolve(t, pages=TaskPages(tuple(acquire.get(i, ())), tuple(use.get(i, ())),
                                                 tuple(use.get(i, ()))))
                if i in acquire or i in use else t for i, t in enumerate(tasks))
    return out, tuple(PagePool(sm, pages, page_bytes) for sm in range(num_sms))


def stage_depths(schedule: Schedule) -> list[int]:
    """Per task (list order): the number of dependent stages on the longest chain of waits ending at it
    (1 for a task that waits on nothing; else 1 + the deepest producer of any counter it waits on). SM
    queue order is not counted: this is the DAG's critical path in hand-offs, the figure fusions cut."""
    prods: dict[int, list[int]] = {}
    for i, t in enumerate(schedule.tasks):
        prods.setdefault(t.signal, []).append(i)
    depth = [0] * len(schedule.tasks)
    for i, t in enumerate(schedule.tasks):
        d = 0
        for w in t.waits:
            for j in prods.get(w.counter, ()):
                if j < i:
                    d = max(d, depth[j])
        depth[i] = d + 1
    return depth


def layer_stages(schedule: Schedule) -> dict:
    """The critical path of a lowered step: ``total`` stages, ``per_layer`` (stages from the writers of
    ``h.i`` to those of ``h.{i+1}``, the same for every layer of a lowering) and ``head`` (after the last
    layer: final norm, LM head, argmax)."""
    depth = stage_depths(schedule)
    writer: dict[str, int] = {}
    for i, t in enumerate(schedule.tasks):
        for o in t.outputs:
            writer[o] = max(writer.get(o, 0), depth[i])
    layers = int(schedule.meta.get("layers", 0))
    per = sorted({writer[f"h.{i + 1}"] - writer[f"h.{i}"] for i in range(layers)})
    return {"total": max(depth, default=0), "per_layer": per[0] if len(per) == 1 else per,
            "head": writer[NEXT_TOKEN] - writer[f"h.{layers}"]}
