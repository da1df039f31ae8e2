"""Schedule -> the CUDA VM's packed tables: the ABI matches abi.h, encodings round-trip, device dtypes
follow the precision contract, positions become launch arguments, and memory-unsafe schedules are
refused by the encoder even though it never judges synchronisation."""

from __future__ import annotations

import attrs
import numpy as np
import pytest
from mosaic.plugins import host
from mosaic_amk.bench.microbench import deadlock, handoff_chain, op_schedule, split_rows
from mosaic_amk.config import VM_FUSIONS, ScheduleConfig
from mosaic_amk.cuda import decode as D
from mosaic_amk.cuda import encode as E
from mosaic_amk.lowering import lower
from mosaic_amk.model import INV_FREQ
from mosaic_amk.schedule import Buffer, Wait
from mosaic_amk.tiny_models import tiny_model

GPU = host().get("gpus", "h200")
CFGS = {"fused": ScheduleConfig(gemv_rows_per_task=16, kv_max_tokens=64),
        # every fusion the VM runs (rmsnorm_gemv, gemv_rope_append: 5 stages per layer), rows of two heads
        "vm-fused": ScheduleConfig(gemv_rows_per_task=32, kv_max_tokens=64, fusion=VM_FUSIONS),
        "unfused": ScheduleConfig(gemv_rows_per_task=24, fusion=(), num_sms=7, kv_page_tokens=8, kv_max_tokens=64,
                                  attention_kv_heads_per_task=2)}


def test_abi_matches_header():
    header = D.abi_constants()
    for name, value in D.expected_abi().items():
        assert header.get(name) == value, (name, header.get(name), value)


def _normalise(s):
    """What decode(encode(s)) must give back: no ranges, float32-rounded floats, device dtypes."""
    dts = E.device_dtypes(s)
    tasks = []
    for t in s.tasks:
        params = {k: (float(np.float32(v)) if isinstance(v, float) else v) for k, v in t.params.items()}
        tasks.append(attrs.evolve(t, params=params, ranges={}))
    bufs = tuple(attrs.evolve(b, dtype=E.DTYPE_NAMES[dts[b.name]]) for b in s.buffers)
    return attrs.evolve(s, tasks=tuple(tasks), buffers=bufs, meta={"position": s.meta["position"]})


@pytest.mark.parametrize("family", ["llama", "qwen2"])
@pytest.mark.parametrize("cfg", sorted(CFGS))
def test_round_trip(family, cfg):
    s = lower(tiny_model(family), CFGS[cfg], GPU, 5)
    enc = E.encode(s)
    back = D.decode(enc)
    assert back.to_json() == _normalise(s).to_json()
    # the encoded task table is what the VM walks: one record per task, queues in list order per SM
    assert enc.tasks.shape == (len(s.tasks), E.TASK_WORDS)
    for sm in range(s.num_sms):
        q = enc.queue[enc.queue_offsets[sm]:enc.queue_offsets[sm + 1]].tolist()
        assert q == [i for i, t in enumerate(s.tasks) if t.sm == sm]


def test_device_dtypes_and_flags():
    s = lower(tiny_model("qwen2"), CFGS["fused"], GPU, 3)
    enc = E.encode(s)
    by = {b.name: b for b in enc.buffers}
    assert by[INV_FREQ].dtype == E.DT_F32
    assert by["model.layers.0.self_attn.q_proj.weight"].dtype == E.DT_BF16
    assert by["model.layers.0.self_attn.q_proj.bias"].dtype == E.DT_BF16
    assert by["h.0"].dtype == E.DT_F32 and by["kv.0.k"].dtype == E.DT_F32 and by["token"].dtype == E.DT_I32
    assert enc.token_buf == enc.buffer_id("token") and enc.next_buf == enc.buffer_id("next_token")
    assert enc.rope == (INV_FREQ, 16, 1.0) and enc.max_attention_tokens == 64
    ops = [E.OPS[c] for c in enc.tasks[:, E.W_OP]]
    for i, t in enumerate(s.tasks):
        rec = enc.tasks[i]
        assert ops[i] == t.op and rec[E.W_ID] == t.id and rec[E.W_SIGNAL] == t.signal
        if "position" in t.params:  # a launch argument, and the baked value kept
            assert rec[E.W_FLAGS] & E.F_RUNTIME_POS and rec[E.W_POS] == 3
        if t.op == "gemv" and t.params["bias"]:
            assert rec[E.W_FLAGS] & E.F_BIAS
    # one qkv gemv: its prefetch region is exactly its weight rows (in 16-byte units)
    i = next(i for i, t in enumerate(s.tasks) if t.op == "gemv" and t.params["row_start"] == 16)
    t = s.tasks[i]
    w = by[t.inputs[1]]
    rec = enc.tasks[i]
    regions = {int(rec[E.W_PF + 3 * k]): (int(rec[E.W_PF + 3 * k + 1]), int(rec[E.W_PF + 3 * k + 2]))
               for k in range(E.MAX_PF) if rec[E.W_PF + 3 * k] >= 0}
    k_in = w.shape[1]
    assert regions[enc.buffer_id(w.name)] == (16 * k_in * 2 // 16, (t.params["row_end"] - 16) * k_in * 2 // 16)


def test_structure_is_position_invariant():
    m = tiny_model("llama")
    keys = {E.structure_key(lower(m, CFGS["fused"], GPU, p)) for p in (0, 1, 17, 63)}
    assert len(keys) == 1
    other = E.structure_key(lower(m, attrs.evolve(CFGS["fused"], gemv_rows_per_task=8), GPU, 0))
    assert other not in keys


def _refuses(s, words):
    with pytest.raises(E.EncodeError) as exc:
        E.encode(s)
    assert all(w in str(exc.value) for w in words), str(exc.value)


def test_memory_unsafe_schedules_are_refused():
    s = lower(tiny_model("llama"), CFGS["fused"], GPU, 0)
    i = next(i for i, t in enumerate(s.tasks) if t.op == "gemv")
    t = s.tasks[i]

    def with_task(new):
        tasks = list(s.tasks)
        tasks[i] = new
        return attrs.evolve(s, tasks=tuple(tasks))

    _refuses(with_task(attrs.evolve(t, waits=(Wait(10_000, 1),))), ["counter 10000"])
    _refuses(with_task(attrs.evolve(t, signal=-1)), ["signal counter -1"])
    _refuses(with_task(attrs.evolve(t, sm=999)), ["sm 999"])
    _refuses(with_task(attrs.evolve(t, params={**t.params, "row_end": 10_000})), ["rows", "outside"])
    _refuses(with_task(attrs.evolve(t, waits=tuple(Wait(0, 1) for _ in range(9)))), ["8 waits"])
    _refuses(with_task(attrs.evolve(t, inputs=(t.inputs[0], "nope"))), ["unknown buffer"])
    _refuses(with_task(attrs.evolve(t, outputs=(t.inputs[1],))), [t.inputs[1]])  # a weight as output
    bf16_act = attrs.evolve(s, buffers=tuple(attrs.evolve(b, dtype="bf16") if b.name == "h.0" else b
                                             for b in s.buffers))
    _refuses(bf16_act, ["h.0", "f32"])
    # a GEMV whose in-features are not a multiple of 8 cannot use 16-byte loads
    bufs = [Buffer("x", "f32", (12,), "input"), Buffer("w", "f32", (16, 12), "weight"),
            Buffer("y", "f32", (16,), "output")]
    _refuses(op_schedule("gemv", bufs, ["x", "w"], ["y"], {"bias": False, "residual": False}, 4,
                         split_rows(16, 4), ["w", "y"]), ["multiple of 8"])


def test_synchronisation_is_not_the_encoders_business():
    """A deadlocking schedule is memory-safe: the encoder packs it (the launcher's gate refuses it)."""
    enc = E.encode(deadlock(132))
    assert enc.tasks[0, E.W_NWAIT] == 1 and enc.tasks[0, E.W_WAIT] == 1 and enc.tasks[1, E.W_WAIT] == 0
    chain = E.encode(handoff_chain(50, [0, 1], 132))
    assert chain.queue_offsets[1] - chain.queue_offsets[0] == 25 and chain.queue_offsets[2] == 50


def test_micro_schedules_validate_and_encode():
    """The device script's one-op schedules pass the gate (a rejected one would cost a GPU stage)."""
    from mosaic_amk.validate import validate

    n = 64
    bufs = [Buffer("x", "f32", (n,), "input"), Buffer("w", "f32", (n,), "weight"), Buffer("y", "f32", (n,), "output")]
    s = op_schedule("rmsnorm", bufs, ["x", "w"], ["y"], {"eps": 1e-5}, 4)
    assert validate(s).ok and E.encode(s).tasks.shape[0] == 1
    bufs = [Buffer("x", "f32", (16,), "input"), Buffer("w", "f32", (100, 16), "weight"),
            Buffer("logits", "f32", (100,), "output"), Buffer("next_token", "i32", (1,), "output")]
    s = op_schedule("gemv", bufs, ["x", "w"], ["logits"], {"bias": False, "residual": False}, 4,
                    split_rows(100, 4), ["w", "logits"], argmax_of="logits")
    assert validate(s).ok and s.tasks[-1].waits == (Wait(0, 4),)


def test_producers_per_counter_for_multi_step_waits():
    """A launch of n steps waits for threshold + step * producers[counter]: producers must count exactly the
    tasks that signal each counter, and every all-join threshold equals its counter's producer count."""
    m = tiny_model("llama3")
    s = lower(m, ScheduleConfig(gemv_rows_per_task=16, kv_max_tokens=64), GPU, 3)
    enc = E.encode(s)
    want = np.zeros(s.num_counters, np.int32)
    for t in s.tasks:
        want[t.signal] += 1
    assert (enc.producers == want).all() and want.sum() == len(s.tasks)
    for t in s.tasks:
        for w in t.waits:
            assert w.threshold == enc.producers[w.counter]


def test_attention_head_dim_must_allow_float4_rows():
    hd, nh, nkv = 6, 2, 1
    bufs = [Buffer("q", "f32", (nh * hd,), "input"), Buffer("k", "f32", (2, 4, nkv * hd), "kv_cache"),
            Buffer("v", "f32", (2, 4, nkv * hd), "kv_cache"), Buffer("y", "f32", (nh * hd,), "output")]
    params = {"position": 3, "num_heads": nh, "num_kv_heads": nkv, "head_dim": hd, "window": 0, "scale": 0.5,
              "page_tokens": 4}
    s = op_schedule("attention", bufs, ["q", "k", "v"], ["y"], params, 4, [(0, nh * hd)], ["q", "y"],
                    position=3)
    with pytest.raises(E.EncodeError, match="multiple of 4"):
        E.encode(s)


# ------------------------------------------------------------------------------------ fused GEMV ops

FUSED_GEMV_OPS = ("rmsnorm_gemv", "rmsnorm_gemv_silu_mul", "gemv_rope", "gemv_rope_append")


def test_fused_gemv_ops_are_vm_ops_in_abi_order():
    """The four fused GEMVs, then the split argmax's two ops, moved from ops.FUSED_SPECS into ops.SPECS, appended to
    encode.OPS (abi.h's OP_*)."""
    from mosaic_amk import ops

    split = ("argmax_partial", "argmax_combine")
    assert E.OPS[-6:] == (*FUSED_GEMV_OPS, *split) and set(E.OPS) == set(ops.SPECS)
    assert not set(FUSED_GEMV_OPS + split) & set(ops.FUSED_SPECS)
    header = D.abi_constants()
    assert [header[f"OP_{o.upper()}"] for o in FUSED_GEMV_OPS + split] == [11, 12, 13, 14, 15, 16]
    assert header["AMK_NUM_OPS"] == 17


@pytest.mark.parametrize("family", ["llama", "qwen2", "llama3"])
def test_vm_fusions_lower_validate_and_encode(family):
    """With rmsnorm_gemv + gemv_rope_append on, the lowering has no rmsnorm/rope/append stage left, the validator
    accepts it at two positions of one structure, and the encoding carries the new flags and the RoPE table."""
    from mosaic_amk.lowering import layer_stages
    from mosaic_amk.validate import validate

    cfg = CFGS["vm-fused"]
    m = tiny_model(family)
    s0, s1 = lower(m, cfg, GPU, 0), lower(m, cfg, GPU, 37)
    assert validate(s0).ok and validate(s1).ok
    assert E.structure_key(s0) == E.structure_key(s1)
    ops_used = {t.op for t in s0.tasks}
    assert set(FUSED_GEMV_OPS) <= ops_used and not ops_used & {"rmsnorm", "rope", "rope_append", "kv_append"}
    assert layer_stages(s0)["per_layer"] == 5
    enc = E.encode(s1)
    assert enc.rope == (INV_FREQ, m.head_dim, float(np.float32(m.attention_scaling)))
    by = {b.name: b for b in enc.buffers}
    assert by[INV_FREQ].dtype == E.DT_F32
    for i, t in enumerate(s1.tasks):
        rec = enc.tasks[i]
        if t.op not in FUSED_GEMV_OPS:
            continue
        assert E.OPS[rec[E.W_OP]] == t.op
        assert bool(rec[E.W_FLAGS] & E.F_NORM) == bool(t.params.get("norm")), t
        assert bool(rec[E.W_FLAGS] & E.F_ROPE) == bool(t.params.get("rope")), t
        assert bool(rec[E.W_FLAGS] & E.F_BIAS) == bool(t.params.get("bias")), t
        if "eps" in t.params:
            assert rec[E.W_EPS] == np.array([t.params["eps"]], np.float32).view(np.int32)[0]
        if "position" in t.params:
            assert rec[E.W_FLAGS] & E.F_RUNTIME_POS and rec[E.W_POS] == 37
        # prefetch: the weight rows (never the norm weight's whole-buffer region in place of them)
        w = t.inputs[2] if t.op.startswith("rmsnorm_gemv") else t.inputs[1]
        regions = {int(rec[E.W_PF + 3 * k]): (int(rec[E.W_PF + 3 * k + 1]), int(rec[E.W_PF + 3 * k + 2]))
                   for k in range(E.MAX_PF) if rec[E.W_PF + 3 * k] >= 0}
        k_in = by[w].shape[1]
        r0, r1 = t.params["row_start"], t.params["row_end"]
        assert regions[enc.buffer_id(w)] == (r0 * k_in * 2 // 16, (r1 - r0) * k_in * 2 // 16)


def test_vm_still_refuses_split_kv():
    """split_kv uses ops.FUSED_SPECS: the encoder refuses its ops by name (no launch)."""
    s = lower(tiny_model("llama"), ScheduleConfig(gemv_rows_per_task=16, kv_max_tokens=64,
                                                  fusion=(*VM_FUSIONS, "split_kv")), GPU, 0)
    _refuses(s, ["unknown op", "attention_partial"])


def test_split_argmax_encodes_and_decodes():
    """The split argmax (argmax_partial per argmax_rows_per_task logits, one argmax_combine): the part index in
    W_PART, the row range in W_ROW0/1, decode(encode(s)) gives the tasks back; a part outside val / idx, or rows
    outside the logits, is refused."""
    cfg = ScheduleConfig(gemv_rows_per_task=16, kv_max_tokens=64, fusion=(*VM_FUSIONS, "split_argmax"),
                         argmax_rows_per_task=100)
    s = lower(tiny_model("llama"), cfg, GPU, 3)
    enc = E.encode(s)
    parts = [(i, t) for i, t in enumerate(s.tasks) if t.op == "argmax_partial"]
    assert len(parts) == -(-tiny_model("llama").vocab_size // 100) and any(t.op == "argmax_combine" for t in s.tasks)
    for i, t in parts:
        rec = enc.tasks[i]
        assert (rec[E.W_OP], rec[E.W_PART], rec[E.W_ROW0], rec[E.W_ROW1]) == (
            E.OP_CODE["argmax_partial"], t.params["part"], t.params["row_start"], t.params["row_end"])
    back = {t.id: t for t in D.decode(enc).tasks}
    assert all(back[t.id].params == {k: t.params[k] for k in ("row_start", "row_end", "part")} for _, t in parts)
    i, t = parts[-1]
    _refuses(_with(s, i, params={**t.params, "part": 10_000}), ["part 10000 outside"])
    _refuses(_with(s, i, params={**t.params, "row_end": 10 ** 6}), ["outside the logits"])


def _with(s, i, **kw):
    tasks = list(s.tasks)
    tasks[i] = attrs.evolve(s.tasks[i], **kw)
    return attrs.evolve(s, tasks=tuple(tasks))


def test_fused_gemv_memory_unsafe_schedules_are_refused():
    s = lower(tiny_model("llama"), CFGS["vm-fused"], GPU, 0)
    hd = tiny_model("llama").head_dim

    def first(op, **want):
        return next(i for i, t in enumerate(s.tasks) if t.op == op and all(t.params.get(k) == v
                                                                          for k, v in want.items()))

    i = first("gemv_rope")
    t = s.tasks[i]
    # RoPE rotates within a head: rows must be whole heads
    _refuses(_with(s, i, params={**t.params, "row_end": t.params["row_end"] - 2}), ["whole heads"])
    # rows outside the weight
    _refuses(_with(s, i, params={**t.params, "row_end": 10_000}), ["outside"])
    # the norm weight must have in-features elements (a shorter one would be read past its end)
    nw_pos = 3  # x, w, inv_freq, nw, ...
    assert t.params["norm"] and t.inputs[nw_pos].endswith("input_layernorm.weight")
    _refuses(_with(s, i, inputs=(*t.inputs[:nw_pos], INV_FREQ, *t.inputs[nw_pos + 1:])), ["nw"])
    # a KV append whose columns pass kv_dim
    j = first("gemv_rope_append", rope=True)
    u = s.tasks[j]
    kvd = next(b for b in s.buffers if b.name == u.outputs[0]).shape[2]
    _refuses(_with(s, j, params={**u.params, "row_start": kvd, "row_end": kvd + hd}), ["outside"])
    # page_tokens must be the cache's
    _refuses(_with(s, j, params={**u.params, "page_tokens": 3}), ["page_tokens"])
    # rmsnorm_gemv: x of another length than the weight's in-features
    k = first("rmsnorm_gemv")
    v = s.tasks[k]
    other = next(b.name for b in s.buffers if b.kind == "activation" and b.shape[0] != tiny_model("llama").hidden_size)
    _refuses(_with(s, k, inputs=(other, *v.inputs[1:])), ["columns"])


def test_error_bits_have_messages():
    """Every E_* bit of abi.h has a launcher message (a bit without one would raise an empty DeviceError)."""
    from mosaic_amk.cuda.launcher import ERRORS

    bits = {v for k, v in D.abi_constants().items() if k.startswith("E_")}
    assert bits == set(ERRORS) and 8 in bits


def _run_numpy(s, inputs, weights):
    """The schedule in list order with ops.KERNELS (float32), on fresh buffers: {name: array}."""
    from mosaic_amk import ops

    mem = {}
    for b in s.buffers:
        src = inputs.get(b.name, weights.get(b.name))
        mem[b.name] = (np.array(src, np.float32).reshape(b.shape) if src is not None
                       else np.zeros(b.shape, np.float32 if b.dtype == "f32" else np.int32))
    for t in s.tasks:
        ops.KERNELS[t.op]([mem[n] for n in t.inputs], [mem[n] for n in t.outputs], t.params)
    return mem


@pytest.mark.parametrize("case", ["rmsnorm_gemv", "rmsnorm_gemv_silu_mul", "gemv_rope", "gemv_rope_append_k",
                                  "gemv_rope_append_v"])
def test_fused_gemv_micro_cases(case):
    """The device script's fused-vs-unfused micro schedules pass the gate and the encoder, and in float32 numpy
    both compute the reference (so on the device any difference is the micro-kernels')."""
    from mosaic_amk.bench.microbench import fused_gemv_case
    from mosaic_amk.validate import validate

    c = fused_gemv_case(case, np.random.default_rng(1), hidden=64, rows=48, heads=4, head_dim=16, num_sms=5,
                        position=21, page=8, pages=4)
    for kind in ("fused", "unfused"):
        s = c[kind]
        assert validate(s).ok, (kind, validate(s).lines())
        enc = E.encode(s, runtime_position=False)
        assert {E.OPS[o] for o in enc.tasks[:, E.W_OP]} == {t.op for t in s.tasks}
        got = _run_numpy(s, c["inputs"], c["weights"])[c["out"]]
        np.testing.assert_allclose(got, c["ref"], rtol=1e-5, atol=1e-5 * np.abs(c["ref"]).max())
    assert {t.op for t in c["fused"].tasks} == {c["op"]} and len(c["fused"].tasks) > 1  # split over SMs


def test_bench_probe_masks_follow_the_schedule():
    """The bench's "where the time goes" probes: skip masks built from the ops the schedule uses; the fused
    schedule has no rmsnorm op, so no "skip norms" probe; gemv-only and skip-gemv partition every op."""
    from mosaic_amk.bench.bench import GEMV_OPS, probe_masks
    from mosaic_amk.cuda.launcher import SKIPPABLE

    for cfg, norms in ((CFGS["fused"], True), (CFGS["vm-fused"], False)):
        enc = E.encode(lower(tiny_model("llama"), cfg, GPU, 3))
        present = {E.OPS[int(o)] for o in enc.tasks[:, E.W_OP]}
        probes = dict(probe_masks(enc))
        masks = {k: v["skip_ops"] for k, v in probes.items() if "skip_ops" in v}
        every = sum(SKIPPABLE[o] for o in present)
        assert masks["skip all ops (sync skeleton)"] == every
        assert masks["skip gemv ops"] | masks["only gemv ops (skip the rest)"] == every
        assert masks["skip gemv ops"] & masks["only gemv ops (skip the rest)"] == 0
        assert masks["skip gemv ops"] == sum(SKIPPABLE[o] for o in present & set(GEMV_OPS))
        assert masks["skip attention"] == SKIPPABLE["attention"]
        assert ("skip norms" in masks) == norms


def test_prefetch_max_bytes_caps_each_task_region():
    """encode(prefetch_max_bytes=N) keeps each row task's L2-prefetch regions at the start of its rows, N bytes in
    all (split evenly over gate and up); 0 keeps the whole rows."""
    from mosaic_amk.tiny_models import tiny_model

    m = tiny_model("llama")
    s = lower(m, ScheduleConfig(gemv_rows_per_task=64), host().get("gpus", "h200"), 0)
    full, capped = E.encode(s), E.encode(s, prefetch_max_bytes=1024)
    seen = 0
    for i in range(len(s.tasks)):
        n = sum(1 for k in range(E.MAX_PF) if full.tasks[i, E.W_PF + 3 * k] >= 0)
        for k in range(n):
            bid, lo, cnt = full.tasks[i, E.W_PF + 3 * k: E.W_PF + 3 * k + 3]
            cbid, clo, ccnt = capped.tasks[i, E.W_PF + 3 * k: E.W_PF + 3 * k + 3]
            assert (cbid, clo) == (bid, lo) and ccnt == min(cnt, 1024 // n // 16)
            seen += cnt > ccnt
    assert seen > 0  # some region was really cut
