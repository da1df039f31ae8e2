"""The fused ops (ops.FUSED_SPECS) and the declared footprints.

- each fused op equals the composition of the unfused ops it replaces (bit for bit where the float32
  arithmetic is the same, within 1e-6 for the split-KV softmax);
- the validator (rules, screen) and the executor accept every fused lowering of every family under the
  lowering tests' configs with the CPU-only switches added, at several positions;
- the executor's probe checks each declaration by running the op: a wrong declaration is a fault;
- the stage count per layer (critical path of waits) of the Llama-3.2-1B shape, before and after.
"""

from __future__ import annotations

import attrs
import numpy as np
import pytest
from mosaic.plugins import host
from mosaic_amk import columns, ops
from mosaic_amk.config import CPU_FUSIONS, DEFAULT_FUSIONS, FUSIONS, ScheduleConfig
from mosaic_amk.footprints import split_range
from mosaic_amk.lowering import layer_stages, lower
from mosaic_amk.model import INV_FREQ, ModelSpec
from mosaic_amk.schedule import Buffer
from mosaic_amk.tiny_models import TINY_FAMILIES, tiny_model
from mosaic_amk.validate import validate, validate_rules
from mosaic_amk.validate.oracle import _PROBED, explore, probe_footprint
from mosaic_amk.validate.screen import screen as _screen

F32 = np.float32


@pytest.fixture(scope="module")
def h200():
    return host().get("gpus", "h200")


def rnd(*shape, seed=0):
    return np.random.default_rng(seed + sum(shape)).standard_normal(shape).astype(F32)


# ------------------------------------------------------------------------------------------ semantics

def test_rmsnorm_gemv_is_rmsnorm_then_gemv_bit_for_bit():
    x, nw, w, b, res = rnd(32), rnd(32, seed=1), rnd(24, 32), rnd(24, seed=2), rnd(24, seed=3)
    p = {"row_start": 8, "row_end": 16, "bias": True, "residual": True, "eps": 1e-5}
    xn = np.empty(32, F32)
    ops.KERNELS["rmsnorm"]([x, nw], [xn], {"eps": 1e-5})
    want, got = np.full(24, np.nan, F32), np.full(24, np.nan, F32)
    ops.KERNELS["gemv"]([xn, w, b, res], [want], p)
    ops.KERNELS["rmsnorm_gemv"]([x, nw, w, b, res], [got], p)
    assert np.array_equal(want, got, equal_nan=True) and np.isnan(got[:8]).all() and not np.isnan(got[8:16]).any()
    act_w, act_g = np.zeros(24, F32), np.zeros(24, F32)
    q = {"row_start": 0, "row_end": 24, "bias": False, "eps": 1e-5}
    ops.KERNELS["gemv_silu_mul"]([xn, w, w[::-1].copy()], [act_w], q)
    ops.KERNELS["rmsnorm_gemv_silu_mul"]([x, nw, w, w[::-1].copy()], [act_g], q)
    assert np.array_equal(act_w, act_g)


def test_gemv_rope_and_gemv_rope_append_equal_gemv_then_rope_then_append():
    hd, nh, h = 8, 4, 16
    x, nw, w, inv = rnd(h), rnd(h, seed=1), rnd(nh * hd, h), rnd(hd // 2, seed=4)
    rope = {"position": 9, "head_dim": hd, "attention_scaling": 1.0}
    xn, y, yr = np.empty(h, F32), np.empty(nh * hd, F32), np.empty(nh * hd, F32)
    ops.KERNELS["rmsnorm"]([x, nw], [xn], {"eps": 1e-6})
    ops.KERNELS["gemv"]([xn, w], [y], {"row_start": 0, "row_end": nh * hd, "bias": False, "residual": False})
    ops.KERNELS["rope"]([y, inv], [yr], {**rope, "num_heads": nh})
    got = np.full(nh * hd, np.nan, F32)
    base = {**rope, "bias": False, "norm": True, "eps": 1e-6}
    for r0 in range(0, nh * hd, 2 * hd):  # two heads per task
        ops.KERNELS["gemv_rope"]([x, w, inv, nw], [got], {**base, "row_start": r0, "row_end": r0 + 2 * hd})
    assert np.array_equal(got, yr)
    cache = np.zeros((4, 4, nh * hd), F32)
    for r0 in range(0, nh * hd, hd):
        ops.KERNELS["gemv_rope_append"]([x, w, inv, nw], [cache],
                                        {**base, "rope": True, "page_tokens": 4, "row_start": r0, "row_end": r0 + hd})
    assert np.array_equal(cache[2, 1], yr) and not cache[2, 0].any() and not cache[2, 2].any()
    ops.KERNELS["gemv_rope_append"]([x, w, nw], [cache], {**base, "rope": False, "page_tokens": 4, "row_start": 0,
                                                          "row_end": nh * hd})
    assert np.array_equal(cache[2, 1], y)


@pytest.mark.parametrize("position, window, splits", [(0, 0, 3), (2, 0, 4), (13, 0, 3), (13, 5, 2), (30, 0, 1)])
def test_split_kv_attention_equals_attention(position, window, splits):
    nh, nkv, hd, page = 4, 2, 8, 4
    kc, vc = rnd(8, page, nkv * hd, seed=5), rnd(8, page, nkv * hd, seed=6)
    q = rnd(nh * hd, seed=7)
    base = {"position": position, "num_heads": nh, "num_kv_heads": nkv, "head_dim": hd, "window": window,
            "scale": hd ** -0.5, "page_tokens": page}
    want = np.zeros(nh * hd, F32)
    ops.KERNELS["attention"]([q, kc, vc], [want], {**base, "row_start": 0, "row_end": nh * hd})
    part, ml = np.full((splits, nh * hd), np.nan, F32), np.full((splits, nh, 2), np.nan, F32)
    for g in range(nkv):  # one task per (kv head group, chunk)
        r0, r1 = g * 2 * hd, (g + 1) * 2 * hd
        for s in range(splits):
            ops.KERNELS["attention_partial"]([q, kc, vc], [part, ml],
                                             {**base, "row_start": r0, "row_end": r1, "split": s, "num_splits": splits})
    got = np.full(nh * hd, np.nan, F32)
    ops.KERNELS["attention_combine"]([part, ml], [got], {"row_start": 0, "row_end": nh * hd, "head_dim": hd,
                                                         "num_heads": nh, "num_splits": splits})
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
    assert not np.isnan(part).any() and not np.isnan(ml).any()


@pytest.mark.parametrize("logits", [np.array([1, 5, 2, 5, 0, 7, 7, 3, 1], F32), rnd(100, seed=8),
                                    np.array([0, 0, 0, 0, 0], F32)])
@pytest.mark.parametrize("step", [1, 2, 4, 64])
def test_split_argmax_is_the_first_index_of_the_max(logits, step):
    parts = -(-len(logits) // step)
    val, idx = np.zeros(parts, F32), np.full(parts, -1, np.int32)
    for k, r0 in enumerate(range(0, len(logits), step)):
        ops.KERNELS["argmax_partial"]([logits], [val, idx], {"row_start": r0, "row_end": min(len(logits), r0 + step),
                                                             "part": k})
    tok = np.zeros(1, np.int32)
    ops.KERNELS["argmax_combine"]([val, idx], [tok], {})
    assert tok[0] == int(np.argmax(logits))


# ------------------------------------------------------------------------------------------ validation

# the fused ops: ops.FUSED_SPECS plus the fused GEMVs and the split argmax the CUDA VM now runs (moved to ops.SPECS)
FUSED_OPS = set(ops.FUSED_SPECS) | {"rmsnorm_gemv", "rmsnorm_gemv_silu_mul", "gemv_rope", "gemv_rope_append",
                                    "argmax_partial", "argmax_combine"}
ALL_ON = [ScheduleConfig(gemv_rows_per_task=16, fusion=FUSIONS),
          ScheduleConfig(sm_policy="single", fusion=FUSIONS, attention_kv_splits=3, argmax_rows_per_task=7),
          ScheduleConfig(gemv_rows_per_task=7, fusion=CPU_FUSIONS, sm_policy="least_loaded", num_sms=5,
                         attention_kv_heads_per_task=2, kv_page_tokens=4, attention_kv_splits=5,
                         argmax_rows_per_task=32)]


@pytest.mark.parametrize("family", TINY_FAMILIES)
def test_validator_and_executor_accept_every_fused_lowering(h200, family):
    m = tiny_model(family)
    fused_ops = set()
    for cfg in ALL_ON:
        for pos in (0, 1, 6, 17):
            s = lower(m, cfg, h200, pos)
            fused_ops |= {t.op for t in s.tasks} & FUSED_OPS
            assert _screen(columns.from_schedule(s))  # the numpy screen accepts it on its own
            result = validate_rules(s)
            assert result.ok, result.lines()
            assert validate(s).ok
            verdict = explore(s, runs=3, seed=pos)
            assert verdict.safe, [f.line() for f in verdict.findings]
    assert fused_ops == FUSED_OPS  # every fused op was lowered, validated and probed


def test_default_config_uses_no_cpu_only_op(h200):
    assert ScheduleConfig().fusion == DEFAULT_FUSIONS and not set(DEFAULT_FUSIONS) & set(CPU_FUSIONS)
    s = lower(tiny_model("qwen2"), ScheduleConfig(), h200, 3)
    assert {t.op for t in s.tasks} <= set(ops.SPECS) - FUSED_OPS  # the defaults use no fused op


def test_a_fused_schedule_missing_its_kv_wait_is_rejected(h200):
    s = lower(tiny_model("llama"), ALL_ON[0], h200, 5)
    kv_counters = {t.signal for t in s.tasks if t.op == "gemv_rope_append"}
    # the last KV chunk holds the appended position (the others never read it: element-exact footprints)
    i = next(i for i, t in enumerate(s.tasks) if t.op == "attention_partial"
             and split_range(0, 6, t.params["split"], t.params["num_splits"])[1] == 6)
    t = s.tasks[i]
    bad = attrs.evolve(t, waits=tuple(w for w in t.waits if w.counter not in kv_counters))
    s2 = attrs.evolve(s, tasks=(*s.tasks[:i], bad, *s.tasks[i + 1:]))
    assert "kv-order" in validate(s2).codes() and not explore(s2, runs=6).safe


# ------------------------------------------------------------------------------------------ the probe

def _bufs(*specs):
    return [Buffer(f"b{k}", "f32", shape, "activation") for k, shape in enumerate(specs)]


def test_probe_accepts_the_true_declaration_and_catches_wrong_ones(monkeypatch):
    p = {"row_start": 2, "row_end": 5, "bias": False, "residual": False}
    ins, outs = _bufs((6,), (8, 6)), _bufs((8,))
    spec = ops.OP_SPECS["gemv"]
    good = spec.footprint(p, [(6,), (8, 6)], [(8,)])
    assert good == [(0, 6), (12, 30), (2, 5)]
    assert probe_footprint("gemv", p, ins, outs, good) is None
    # a write footprint one row too narrow or too wide, and a read footprint that misses a row of w
    assert "writes" in probe_footprint("gemv", {**p, "row_end": 4}, ins, outs, [(0, 6), (12, 24), (2, 3)])
    assert "unwritten" in probe_footprint("gemv", p, ins, outs, [(0, 6), (12, 30), (2, 6)])
    assert "reads outside" in probe_footprint("gemv", p, ins, outs, [(0, 6), (12, 24), (2, 5)])
    assert "reads outside" in probe_footprint("gemv", p, ins, outs, [(0, 5), (12, 30), (2, 5)])


def test_a_wrong_declaration_makes_real_lowerings_unsafe_for_the_oracle(h200, monkeypatch):
    """If attention_combine declared only its first split's rows, the validator (which trusts the
    declaration) would still accept; the executor's probe, running the op, calls the schedule unsafe."""
    s = lower(tiny_model("smollm2"), ALL_ON[0], h200, 9)
    real = ops.FUSED_SPECS["attention_combine"]

    def lying(p, ins, outs):
        got = real.footprint_fn(p, ins, outs)
        return [(got[0][0], got[2][1]), *got[1:]]  # the part read: only split 0's columns

    monkeypatch.setitem(ops.OP_SPECS, "attention_combine", attrs.evolve(real, footprint_fn=lying))
    _PROBED.clear()
    try:
        verdict = explore(s, runs=1)
        assert not verdict.safe and "reads outside its declared footprint" in verdict.findings[0].message
    finally:
        _PROBED.clear()


# ------------------------------------------------------------------------------------------ stage count

def llama_32_1b_shape() -> ModelSpec:
    """The Llama-3.2-1B architecture with zero-stride weights (shapes only: lowering reads no values)."""
    m = ModelSpec(family="llama", vocab_size=128256, hidden_size=2048, intermediate_size=8192, num_layers=16,
                  num_heads=32, num_kv_heads=8, head_dim=64, rms_norm_eps=1e-5, max_position_embeddings=131072,
                  tie_word_embeddings=True, rope_type="llama3")
    zero = np.zeros(1, F32)
    weights = {n: np.broadcast_to(zero, s) for n, s in m.expected_shapes().items()}
    weights[INV_FREQ] = np.ones(32, F32)
    return attrs.evolve(m, weights=weights)


def test_stage_count_per_layer_of_the_llama_32_1b_shape(h200):
    m = llama_32_1b_shape()
    base = ScheduleConfig(kv_max_tokens=4096)
    got = {}
    for name, fusion in (("default", DEFAULT_FUSIONS), ("no-split-kv", (*DEFAULT_FUSIONS, "rmsnorm_gemv",
                                                                          "gemv_rope_append", "split_argmax")),
                         ("all", FUSIONS)):
        s = lower(m, attrs.evolve(base, fusion=fusion), h200, 100)
        got[name] = layer_stages(s)
        assert validate(s).ok
    # default: norm, q/k/v, rope + appends, attention, o + residual, norm, gate.up.silu, down + residual
    assert got["default"] == {"total": 8 * 16 + 3 + 1, "per_layer": 8, "head": 3}
    # no norm stages, no rope/append stage: q/k/v(+rope, +append), attention, o, gate.up.silu, down
    assert got["no-split-kv"]["per_layer"] == 5
    # split-KV adds the combine stage (attention_partial, attention_combine) but spreads attention
    assert got["all"]["per_layer"] == 6
