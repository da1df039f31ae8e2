"""The AMK micro-ops: their signatures (arity, parameters, written region) and their numpy float32
semantics. This module is the single source of truth: the ReferenceVM executes these functions, the
validator reads the signatures, and the CUDA VM's micro-kernels are tested against them.

Conventions (documented in docs/amk.md):

- Every buffer is a dense row-major array. Activations are 1-D ``[n]``; weights keep their checkpoint
  shape (``[out, in]`` for a projection); a KV cache is ``[num_pages, page_tokens, kv_dim]``.
- A task with ``row_start``/``row_end`` parameters writes only rows ``[row_start, row_end)`` of dimension
  0 of its output; tasks whose row ranges are disjoint therefore never write the same element.
- Each op's exact footprint (element intervals per operand) is declared on its ``OpSpec`` (``row_roles``
  or ``footprint_fn``, a function of :mod:`mosaic_amk.footprints`): the one declaration the validator, its
  screen and the oracle read.
- ``kv_append`` and ``rope_append`` write exactly one cache slot: token ``position`` (page
  ``position // page_tokens``, slot ``position % page_tokens``); ``attention`` reads slots
  ``[0, position]`` (or the last ``window`` of them when ``window > 0``).
- Every other task writes its whole output.
- Reductions accumulate in float32 unless stated; the ReferenceVM is float32 end to end.
- A weight may be a quantized tensor (mosaic_amk.quant: int8 per row, GGUF Q8_0 / Q4_1): the GEMVs then run
  quant.matvec's exactly defined float32 arithmetic and the embedding dequantises its row (quant.embed_row).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

import attrs
import numpy as np

from mosaic_amk import footprints as fp
from mosaic_amk import rope_order
from mosaic_amk.footprints import Interval, Shape, rows_footprint, split_range
from mosaic_amk.quant import embed_row, rows_of

F32 = np.float32


@attrs.frozen
class OpSpec:
    """The signature of one op, and its memory footprint.

    ``inputs``/``outputs`` name the positional buffer roles; ``optional`` adds input roles when a boolean
    parameter is true (in the order listed, after ``inputs``); ``params`` are required parameter names;
    ``writes`` is ``"all"``, ``"rows"`` (rows ``[row_start, row_end)`` of output 0), ``"kv_slot"`` (part of
    one cache slot at ``position``; the output must be a ``kv_cache`` buffer) or ``"part"`` (a custom part).

    The footprint is declared here and nowhere else: ``row_roles`` are the roles touched only at rows
    ``[row_start, row_end)`` of axis 0 (every other role is touched whole), or ``footprint_fn`` computes
    it for ops whose footprint is not that simple. ``footprint(params, in_shapes, out_shapes)`` returns
    one element interval of the flattened buffer per operand (inputs, then outputs): exact for writes
    (every element in it is written, none outside), a superset for reads. The validator's rules, its
    numpy screen and the executor's shadow memory all read it; the executor's probe runs the op itself
    on sentinel-filled data to check that the declaration is true (docs/amk-schedule.md)."""

    name: str
    inputs: tuple[str, ...]
    outputs: tuple[str, ...]
    params: tuple[str, ...]
    optional: tuple[tuple[str, str], ...] = ()
    writes: str = "all"
    doc: str = ""
    row_roles: tuple[str, ...] = ()
    footprint_fn: Callable[..., list[Interval] | str] | None = None

    def input_roles(self, params: Mapping[str, Any]) -> tuple[str, ...]:
        if not self.optional:
            return self.inputs
        return self.inputs + tuple(role for flag, role in self.optional if params.get(flag))

    def footprint(self, params: Mapping[str, Any], in_shapes: Sequence[Shape],
                  out_shapes: Sequence[Shape]) -> list[Interval] | str:
        """Element intervals per operand (inputs, then outputs), or a problem (parameters that are not
        integers, or that reach outside a buffer). The arity must already match ``input_roles``."""
        if self.footprint_fn is not None:
            return self.footprint_fn(params, in_shapes, out_shapes)
        return rows_footprint(self.input_roles(params) + self.outputs, self.row_roles, params,
                              (*in_shapes, *out_shapes))

    def whole_prefix(self) -> int | None:
        """For a plain row-split op (no footprint_fn): how many leading input roles are read whole (every
        later input role, optional ones included, and output 0 are row roles). None for other ops. The
        validator's numpy screen vectorises exactly these ops from this declaration."""
        if self.footprint_fn is not None or not self.row_roles:
            return None
        roles = self.inputs + tuple(r for _, r in self.optional)
        k = 0
        while k < len(roles) and roles[k] not in self.row_roles:
            k += 1
        if any(r not in self.row_roles for r in roles[k:]) or tuple(self.outputs) != (self.row_roles[-1],) \
                or len(self.row_roles) != len(roles) - k + 1:
            return None
        return k



_GEMV_PARAMS = ("row_start", "row_end", "bias", "residual")
_ATTN_PARAMS = ("position", "num_heads", "num_kv_heads", "head_dim", "row_start", "row_end", "window",
                "scale", "page_tokens")
_ROPE_PARAMS = ("position", "num_heads", "head_dim", "attention_scaling")
_GEMV_ROWS = ("w", "b", "res", "y")
_SILU_ROWS = ("w_gate", "w_up", "b_gate", "b_up", "y")
_FUSED_GEMV = ("row_start", "row_end", "bias", "eps")
_GEMV_ROPE = ("row_start", "row_end", "bias", "norm", "eps", "position", "head_dim", "attention_scaling")

# The ops the CUDA VM implements (mosaic_amk.cuda.encode.OPS must equal this table's keys).
SPECS: dict[str, OpSpec] = {s.name: s for s in (
    OpSpec("embed", ("table", "token"), ("x",), (), doc="x = table[token[0]]"),
    OpSpec("rmsnorm", ("x", "weight"), ("y",), ("eps",),
           doc="y = weight * (x * rsqrt(mean(x^2) + eps))"),
    OpSpec("gemv", ("x", "w"), ("y",), _GEMV_PARAMS, optional=(("bias", "b"), ("residual", "res")),
           writes="rows", row_roles=_GEMV_ROWS,
           doc="y[r] = res[r] + (w[r] @ x + b[r]) for r in [row_start, row_end)"),
    OpSpec("gemv_silu_mul", ("x", "w_gate", "w_up"), ("y",), ("row_start", "row_end", "bias"),
           optional=(("bias", "b_gate"), ("bias", "b_up")), writes="rows", row_roles=_SILU_ROWS,
           doc="y[r] = silu(w_gate[r] @ x + b_gate[r]) * (w_up[r] @ x + b_up[r])"),
    OpSpec("silu_mul", ("gate", "up"), ("y",), (), doc="y = silu(gate) * up"),
    OpSpec("add", ("a", "b"), ("y",), (), doc="y = a + b"),
    OpSpec("rope", ("x", "inv_freq"), ("y",), _ROPE_PARAMS,
           doc="rotate-half RoPE of each head of x at `position`"),
    OpSpec("kv_append", ("x",), ("cache",), ("position", "page_tokens"), writes="kv_slot",
           footprint_fn=fp.kv_append, doc="cache[position // page_tokens, position % page_tokens] = x"),
    OpSpec("rope_append", ("x", "inv_freq"), ("cache",), (*_ROPE_PARAMS, "page_tokens"), writes="kv_slot",
           footprint_fn=fp.kv_append, doc="kv_append(rope(x))"),
    OpSpec("attention", ("q", "k_cache", "v_cache"), ("y",), _ATTN_PARAMS, writes="rows",
           footprint_fn=fp.attention,
           doc="decode attention of heads row_start/head_dim .. row_end/head_dim over cached tokens (optional "
               "rope_block 8: q and the K cache in the blocked RoPE order, read back in the standard order)"),
    OpSpec("argmax", ("logits",), ("token",), (), footprint_fn=fp.argmax,
           doc="token[0] = first index of max(logits)"),
    # the split argmax (ScheduleConfig.fusion split_argmax)
    OpSpec("argmax_partial", ("logits",), ("val", "idx"), ("row_start", "row_end", "part"), writes="part",
           footprint_fn=fp.argmax_partial,
           doc="val[part], idx[part] = max and first index of max of logits[row_start:row_end]"),
    OpSpec("argmax_combine", ("val", "idx"), ("token",), (), footprint_fn=fp.argmax,
           doc="token[0] = idx[first k of max(val)] (first index of the global max when parts are in order)"),
    # fused GEMVs (the switches rmsnorm_gemv and gemv_rope_append of ScheduleConfig.fusion)
    OpSpec("rmsnorm_gemv", ("x", "nw", "w"), ("y",), (*_FUSED_GEMV, "residual"),
           optional=(("bias", "b"), ("residual", "res")), writes="rows", row_roles=_GEMV_ROWS,
           doc="y[r] = res[r] + (w[r] @ rmsnorm(x, nw, eps) + b[r]): each row task normalises x itself"),
    OpSpec("rmsnorm_gemv_silu_mul", ("x", "nw", "w_gate", "w_up"), ("y",), _FUSED_GEMV,
           optional=(("bias", "b_gate"), ("bias", "b_up")), writes="rows", row_roles=_SILU_ROWS,
           doc="y[r] = silu(w_gate[r] @ xn + b_gate[r]) * (w_up[r] @ xn + b_up[r]), xn = rmsnorm(x, nw, eps)"),
    OpSpec("gemv_rope", ("x", "w", "inv_freq"), ("y",), _GEMV_ROPE,
           optional=(("norm", "nw"), ("bias", "b")), writes="rows", footprint_fn=fp.gemv_rope,
           doc="y[r] = rope(w[r] @ xn + b[r]) for whole heads r (xn = rmsnorm(x, nw, eps) when norm, else x; "
               "optional rope_block 8: rows in the blocked RoPE order, whole blocks)"),
    OpSpec("gemv_rope_append", ("x", "w"), ("cache",), (*_GEMV_ROPE, "rope", "page_tokens"),
           optional=(("rope", "inv_freq"), ("norm", "nw"), ("bias", "b")), writes="kv_slot",
           footprint_fn=fp.gemv_rope_append,
           doc="cache[slot(position)][r] = (rope if rope)(w[r] @ xn + b[r]): a row task's columns of one slot"),
)}

# Fused ops with numpy semantics only: the ReferenceVM, the validator and the executor know them; the CUDA
# VM does not yet (its encoder refuses them as unknown ops), so ScheduleConfig leaves them off by default.
# (The split argmax's two ops moved to SPECS when the VM got them.)
FUSED_SPECS: dict[str, OpSpec] = {s.name: s for s in (
    OpSpec("attention_partial", ("q", "k_cache", "v_cache"), ("part", "ml"), (*_ATTN_PARAMS, "split", "num_splits"),
           writes="part", footprint_fn=fp.attention_partial,
           doc="heads row_start/head_dim .. over KV chunk `split` of `num_splits`: part[split, heads] = "
               "softmax-weighted V of the chunk, ml[split, h] = (max score, sum of exp(score - max))"),
    OpSpec("attention_combine", ("part", "ml"), ("y",), ("row_start", "row_end", "head_dim", "num_heads",
                                                          "num_splits"),
           writes="rows", footprint_fn=fp.attention_combine,
           doc="y[heads] = sum_s exp(m_s - M) l_s part[s] / sum_s exp(m_s - M) l_s"),
)}

OP_SPECS: dict[str, OpSpec] = {**SPECS, **FUSED_SPECS}  # every op: what the validator/executor/ReferenceVM know


def spec(op: str) -> OpSpec | None:
    """The signature of ``op``, or None for an unknown op."""
    return OP_SPECS.get(op)


# ---------------------------------------------------------------------------------------------- semantics

def _rows(params: Mapping[str, Any]) -> slice:
    return slice(int(params["row_start"]), int(params["row_end"]))


def op_embed(ins: Sequence[np.ndarray], outs: Sequence[np.ndarray], p: Mapping[str, Any]) -> None:
    table, token = ins
    outs[0][...] = embed_row(table, int(token[0]))


def _rmsnorm(x: np.ndarray, w: np.ndarray, eps: float) -> np.ndarray:
    x = x.astype(F32, copy=False)
    var = np.mean(x * x, dtype=F32)
    return w * (x * (F32(1.0) / np.sqrt(var + F32(eps), dtype=F32)))


def op_rmsnorm(ins, outs, p) -> None:
    outs[0][...] = _rmsnorm(ins[0], ins[1], p["eps"])


def op_gemv(ins, outs, p) -> None:
    x, w = ins[0], ins[1]
    r = _rows(p)
    y = rows_of(w, r, x)
    k = 2
    if p.get("bias"):
        y = y + ins[k][r]
        k += 1
    if p.get("residual"):
        y = ins[k][r] + y
    outs[0][r] = y


def _silu(v: np.ndarray) -> np.ndarray:
    return v / (F32(1.0) + np.exp(-v, dtype=F32))


def op_gemv_silu_mul(ins, outs, p) -> None:
    x, wg, wu = ins[:3]
    r = _rows(p)
    g = rows_of(wg, r, x)
    u = rows_of(wu, r, x)
    if p.get("bias"):
        g = g + ins[3][r]
        u = u + ins[4][r]
    outs[0][r] = _silu(g) * u


def op_silu_mul(ins, outs, p) -> None:
    outs[0][...] = _silu(ins[0]) * ins[1]


def op_add(ins, outs, p) -> None:
    outs[0][...] = ins[0] + ins[1]


def rope_tables(inv_freq: np.ndarray, position: int, attention_scaling: float) -> tuple[np.ndarray, np.ndarray]:
    """cos and sin of shape [head_dim] as HF computes them: freqs = position * inv_freq in float32,
    emb = cat(freqs, freqs), cos = cos(emb) * attention_scaling."""
    freqs = F32(position) * inv_freq.astype(F32)
    emb = np.concatenate([freqs, freqs])
    cos = np.cos(emb.astype(np.float64)).astype(F32) * F32(attention_scaling)
    sin = np.sin(emb.astype(np.float64)).astype(F32) * F32(attention_scaling)
    return cos, sin


def _rope(x: np.ndarray, inv_freq: np.ndarray, p: Mapping[str, Any]) -> np.ndarray:
    nh, hd = int(p["num_heads"]), int(p["head_dim"])
    cos, sin = rope_tables(inv_freq, int(p["position"]), float(p["attention_scaling"]))
    h = x.reshape(nh, hd)
    half = hd // 2
    rot = np.concatenate([-h[:, half:], h[:, :half]], axis=1)
    return (h * cos + rot * sin).reshape(-1)


def op_rope(ins, outs, p) -> None:
    outs[0][...] = _rope(ins[0], ins[1], p)


def _slot(p: Mapping[str, Any]) -> tuple[int, int]:
    pos, page = int(p["position"]), int(p["page_tokens"])
    return pos // page, pos % page


def op_kv_append(ins, outs, p) -> None:
    outs[0][_slot(p)] = ins[0]


def op_rope_append(ins, outs, p) -> None:
    outs[0][_slot(p)] = _rope(ins[0], ins[1], p)


def _softmax(s: np.ndarray) -> np.ndarray:
    e = np.exp(s - s.max(axis=-1, keepdims=True), dtype=F32)
    return e / e.sum(axis=-1, keepdims=True, dtype=F32)


def op_attention(ins, outs, p) -> None:
    q, kc, vc = ins
    pos, hd = int(p["position"]), int(p["head_dim"])
    nh, nkv = int(p["num_heads"]), int(p["num_kv_heads"])
    window = int(p["window"])
    rep = nh // nkv
    first = max(0, pos - window + 1) if window > 0 else 0
    n = pos + 1
    kv_dim = kc.shape[-1]
    keys = kc.reshape(-1, kv_dim)[first:n].reshape(n - first, nkv, hd)
    vals = vc.reshape(-1, kv_dim)[first:n].reshape(n - first, nkv, hd)
    q, keys = _standard(q, keys, p)
    h0, h1 = int(p["row_start"]) // hd, int(p["row_end"]) // hd
    scale = F32(p["scale"])
    out = outs[0]
    for h in range(h0, h1):
        g = h // rep
        qh = q[h * hd:(h + 1) * hd]
        scores = (keys[:, g, :] @ qh) * scale
        probs = _softmax(scores)
        out[h * hd:(h + 1) * hd] = probs @ vals[:, g, :]


def _standard(q: np.ndarray, keys: np.ndarray, p: Mapping[str, Any]) -> tuple[np.ndarray, np.ndarray]:
    """q and the keys in the standard dim order (``rope_block``: they are stored in the blocked RoPE order)."""
    if not p.get("rope_block"):
        return q, keys
    hd = int(p["head_dim"])
    return rope_order.to_standard(q, hd), rope_order.to_standard(keys, hd)


def op_argmax(ins, outs, p) -> None:
    outs[0][0] = int(np.argmax(ins[0]))


# fused ops (the fused GEMVs of SPECS, then FUSED_SPECS) -----------------------------------------------------

def op_rmsnorm_gemv(ins, outs, p) -> None:
    op_gemv([_rmsnorm(ins[0], ins[1], p["eps"]), *ins[2:]], outs, p)


def op_rmsnorm_gemv_silu_mul(ins, outs, p) -> None:
    op_gemv_silu_mul([_rmsnorm(ins[0], ins[1], p["eps"]), *ins[2:]], outs, p)


def _rope_heads(y: np.ndarray, inv_freq: np.ndarray, p: Mapping[str, Any]) -> np.ndarray:
    """RoPE of rows [row_start, row_end): whole heads, or (``rope_block``) whole blocks of the blocked order, where
    stored row r pairs with r ^ 4 and takes the cos/sin of its standard dim (the same products and sum as
    :func:`_rope` computes for that dim)."""
    hd = int(p["head_dim"])
    if not p.get("rope_block"):
        return _rope(y, inv_freq, {**p, "num_heads": y.shape[0] // hd})
    cos, sin = rope_tables(inv_freq, int(p["position"]), float(p["attention_scaling"]))
    r = np.arange(int(p["row_start"]), int(p["row_end"]))
    dim = rope_order.dims(hd)[r % hd]
    partner = y[(r ^ 4) - r[0]]
    rot = np.where((r % hd) % rope_order.BLOCK < 4, -partner, partner)
    return y * cos[dim] + rot * sin[dim]


def _gemv_pre(ins, p, k: int) -> tuple[np.ndarray, np.ndarray]:
    """(rows of w @ xn + b, remaining inputs) for gemv_rope(_append): inputs x, w, then k fixed roles, then
    nw if norm, b if bias."""
    x, w = ins[0], ins[1]
    rest = list(ins[2 + k:])
    if p.get("norm"):
        x = _rmsnorm(x, rest.pop(0), p["eps"])
    r = _rows(p)
    y = rows_of(w, r, x)
    if p.get("bias"):
        y = y + rest.pop(0)[r]
    return y


def op_gemv_rope(ins, outs, p) -> None:
    y = _gemv_pre(ins, p, 1)
    outs[0][_rows(p)] = _rope_heads(y, ins[2], p)


def op_gemv_rope_append(ins, outs, p) -> None:
    rope = bool(p.get("rope"))
    y = _gemv_pre(ins, p, 1 if rope else 0)
    if rope:
        y = _rope_heads(y, ins[2], p)
    outs[0][_slot(p)][_rows(p)] = y


def op_attention_partial(ins, outs, p) -> None:
    q, kc, vc = ins
    part, ml = outs
    pos, hd = int(p["position"]), int(p["head_dim"])
    nh, nkv = int(p["num_heads"]), int(p["num_kv_heads"])
    window, split, ns = int(p["window"]), int(p["split"]), int(p["num_splits"])
    rep = nh // nkv
    first = max(0, pos - window + 1) if window > 0 else 0
    lo, hi = split_range(first, pos + 1, split, ns)
    kv_dim = kc.shape[-1]
    keys = kc.reshape(-1, kv_dim)[lo:hi].reshape(hi - lo, nkv, hd)
    vals = vc.reshape(-1, kv_dim)[lo:hi].reshape(hi - lo, nkv, hd)
    q, keys = _standard(q, keys, p)
    h0, h1 = int(p["row_start"]) // hd, int(p["row_end"]) // hd
    scale = F32(p["scale"])
    for h in range(h0, h1):
        if hi == lo:  # an empty chunk: no weight in the combine
            part[split, h * hd:(h + 1) * hd] = F32(0.0)
            ml[split, h] = (-np.inf, 0.0)
            continue
        g = h // rep
        scores = (keys[:, g, :] @ q[h * hd:(h + 1) * hd]) * scale
        m = scores.max()
        e = np.exp(scores - m, dtype=F32)
        s = e.sum(dtype=F32)
        part[split, h * hd:(h + 1) * hd] = (e / s) @ vals[:, g, :]
        ml[split, h] = (m, s)


def op_attention_combine(ins, outs, p) -> None:
    part, ml = ins
    hd = int(p["head_dim"])
    h0, h1 = int(p["row_start"]) // hd, int(p["row_end"]) // hd
    for h in range(h0, h1):
        m, s = ml[:, h, 0], ml[:, h, 1]
        big = m.max()
        wgt = np.exp(m - big, dtype=F32) * s
        wgt = wgt / wgt.sum(dtype=F32)
        outs[0][h * hd:(h + 1) * hd] = wgt @ part[:, h * hd:(h + 1) * hd]


def op_argmax_partial(ins, outs, p) -> None:
    seg = ins[0][_rows(p)]
    k = int(np.argmax(seg))
    outs[0][int(p["part"])] = seg[k]
    outs[1][int(p["part"])] = int(p["row_start"]) + k


def op_argmax_combine(ins, outs, p) -> None:
    outs[0][0] = int(ins[1][int(np.argmax(ins[0]))])


KERNELS: dict[str, Callable[[Sequence[np.ndarray], Sequence[np.ndarray], Mapping[str, Any]], None]] = {
    "embed": op_embed, "rmsnorm": op_rmsnorm, "gemv": op_gemv, "gemv_silu_mul": op_gemv_silu_mul,
    "silu_mul": op_silu_mul, "add": op_add, "rope": op_rope, "kv_append": op_kv_append,
    "rope_append": op_rope_append, "attention": op_attention, "argmax": op_argmax,
    "rmsnorm_gemv": op_rmsnorm_gemv, "rmsnorm_gemv_silu_mul": op_rmsnorm_gemv_silu_mul,
    "gemv_rope": op_gemv_rope, "gemv_rope_append": op_gemv_rope_append,
    "attention_partial": op_attention_partial, "attention_combine": op_attention_combine,
    "argmax_partial": op_argmax_partial, "argmax_combine": op_argmax_combine,
}
assert set(KERNELS) == set(OP_SPECS)
