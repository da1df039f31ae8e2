"""The numerics oracle: a correct bf16 GEMM with fp32 accumulation passes in any summation order; zeros,
NaN, a wrong or stale element, a shifted or transposed result and lower-precision computations fail."""

import numpy as np
import pytest
from mosaic.errors import BadInput
from mosaic.oracle import check, oracles
from mosaic.oracle.formats import FORMATS, gamma, lsb_exponent

BF = FORMATS["bf16"]
F32 = np.float32


def bf16(x):
    return BF.round(np.asarray(x, dtype=np.float64)).astype(F32)


def gemm_inputs(m=48, n=40, k=256, seed=0):
    rng = np.random.default_rng(seed)
    return bf16(rng.standard_normal((m, k))), bf16(rng.standard_normal((k, n)))


def acc_sequential(a, b, reverse=False):
    acc = np.zeros((a.shape[0], b.shape[1]), F32)
    ks = range(a.shape[1] - 1, -1, -1) if reverse else range(a.shape[1])
    for k in ks:
        acc = (acc + a[:, k:k + 1] * b[k:k + 1, :]).astype(F32)  # bf16*bf16 is exact in fp32
    return acc


def acc_blocked(a, b, block):
    """fp32 partial products per k-block (like an MMA k-group), partials summed in fp32."""
    acc = np.zeros((a.shape[0], b.shape[1]), F32)
    for k0 in range(0, a.shape[1], block):
        acc = (acc + (a[:, k0:k0 + block] @ b[k0:k0 + block, :]).astype(F32)).astype(F32)
    return acc


def acc_split_k(a, b, splits):
    parts = [acc_sequential(a[:, s], b[s, :]) for s in np.array_split(np.arange(a.shape[1]), splits)]
    out = parts[0]
    for p in parts[1:]:
        out = (out + p).astype(F32)
    return out


def acc_pairwise(a, b):
    prods = (a[:, :, None] * b[None, :, :]).astype(F32)  # exact
    return prods.sum(axis=1, dtype=F32)  # numpy sums float32 pairwise


def verdict(a, b, c, dtype="bf16", **kw):
    return check("gemm", {"a": a, "b": b, **kw}, {"c": c}, dtype)


ORDERS = {
    "sequential": acc_sequential,
    "reversed": lambda a, b: acc_sequential(a, b, reverse=True),
    "blocked-16": lambda a, b: acc_blocked(a, b, 16),
    "blocked-64": lambda a, b: acc_blocked(a, b, 64),
    "split-k-4": lambda a, b: acc_split_k(a, b, 4),
    "pairwise": acc_pairwise,
}


@pytest.mark.parametrize("order", sorted(ORDERS))
def test_correct_bf16_gemm_passes_in_any_summation_order(order):
    a, b = gemm_inputs()
    c = bf16(ORDERS[order](a, b))
    v = verdict(a, b, c)
    assert v.passed, v.reason
    rep = v.outputs[0]
    assert rep.failures == 0 and rep.nonfinite == 0
    assert 0 < rep.max_error_over_band <= 1
    assert rep.max_abs_error > 0 and rep.mean_abs_error < rep.max_abs_error


def test_orders_really_differ():
    a, b = gemm_inputs()
    results = {name: f(a, b) for name, f in ORDERS.items()}
    assert len({r.tobytes() for r in results.values()}) > 2  # the orders are not the same computation


def test_zeros_fail():
    a, b = gemm_inputs()
    v = verdict(a, b, np.zeros((48, 40), F32))
    assert not v.passed and v.outputs[0].failures > 40 * 48 * 0.9


def test_nan_fails_and_is_located():
    a, b = gemm_inputs()
    c = bf16(acc_sequential(a, b))
    c[7, 3] = np.nan  # an element the kernel never wrote (the capture poisons with NaN)
    v = verdict(a, b, c)
    assert not v.passed and "NaN at (7, 3)" in v.reason and v.outputs[0].nonfinite == 1
    c[7, 3] = np.inf
    assert "inf at (7, 3)" in verdict(a, b, c).reason


def test_one_wrong_element_fails():
    a, b = gemm_inputs()
    c = bf16(acc_sequential(a, b))
    c[11, 5] = bf16(c[11, 5] + 4 * BF.spacing(c[11, 5]))
    v = verdict(a, b, c)
    assert not v.passed and v.outputs[0].failures == 1 and v.outputs[0].worst_index == (11, 5)


def test_one_stale_element_fails():
    a, b = gemm_inputs()
    a_old, b_old = gemm_inputs(seed=1)
    c = bf16(acc_sequential(a, b))
    c[20, 30] = bf16(acc_sequential(a_old, b_old))[20, 30]  # left over from the previous inputs
    v = verdict(a, b, c)
    assert not v.passed and v.outputs[0].worst_index == (20, 30)


@pytest.mark.parametrize("shift", [(1, 0), (0, 1), (0, -1)])
def test_shifted_result_fails(shift):
    a, b = gemm_inputs()
    c = np.roll(bf16(acc_sequential(a, b)), shift, axis=(0, 1))
    assert not verdict(a, b, c).passed


def test_transposed_result_fails():
    a, b = gemm_inputs(m=40, n=40)
    c = bf16(acc_sequential(a, b))
    assert verdict(a, b, c).passed
    assert not verdict(a, b, np.ascontiguousarray(c.T)).passed


def test_bf16_accumulation_fails():
    a, b = gemm_inputs()
    acc = np.zeros((48, 40), F32)
    for k0 in range(0, 256, 16):  # an MMA k-group of 16 in fp32, then accumulated in bf16
        acc = bf16(acc + (a[:, k0:k0 + 16] @ b[k0:k0 + 16, :]).astype(F32))
    v = verdict(a, b, acc)
    assert not v.passed and v.outputs[0].failures > 100


def test_fp8_inputs_fail():
    a, b = gemm_inputs()
    e4m3 = lambda x: np.clip(np.round(x * 8) / 8, -448, 448).astype(F32)  # noqa: E731  coarse 3-bit mantissa stand-in
    assert not verdict(a, b, bf16(acc_sequential(e4m3(a), e4m3(b)))).passed


def test_double_rounding_split_k_in_bf16_fails():
    a, b = gemm_inputs(k=512)
    parts = [bf16(acc_sequential(a[:, s], b[s, :])) for s in np.array_split(np.arange(512), 8)]
    out = parts[0]
    for p in parts[1:]:
        out = bf16(out + p)
    assert not verdict(a, b, out).passed


def test_integer_inputs_demand_bit_exact_results():
    rng = np.random.default_rng(3)
    a = rng.integers(-4, 5, (32, 512)).astype(F32)
    b = rng.integers(-4, 5, (512, 24)).astype(F32)
    c = bf16(acc_blocked(a, b, 64))
    v = verdict(a, b, c)
    assert v.passed and v.outputs[0].exact_checked == 32 * 24
    # one unit in the last place off is inside the tolerance band, but not bit-exact: it must fail
    i = np.unravel_index(np.argmax(np.abs(c)), c.shape)
    bad = c.copy()
    bad[i] = bf16(c[i] + BF.spacing(c[i]))
    v = verdict(a, b, bad)
    assert not v.passed and v.outputs[0].exact_mismatches == 1 and "exactly representable" in v.reason


def test_exactness_criterion():
    assert lsb_exponent(np.array([1.0, 0.75, 3.0, 0.0], F32)).tolist() == [0, -2, 0, np.inf]
    rng = np.random.default_rng(0)
    a, b = gemm_inputs()
    c = bf16(acc_sequential(a, b))
    assert verdict(a, b, c).outputs[0].exact_checked < 48 * 40  # random bf16 data: partial sums not exact
    big = (rng.choice([-1, 1], (8, 64)) * 2.0 ** rng.integers(0, 15, (8, 64))).astype(F32)  # products up to 2^28
    assert check("gemm", {"a": big, "b": big.T.copy()}, {"c": bf16(big.astype(np.float64) @ big.T)},
                 "bf16").outputs[0].exact_checked < 64


def test_scale_and_bias_epilogue():
    a, b = gemm_inputs()
    rng = np.random.default_rng(5)
    bias = bf16(rng.standard_normal(40))
    acc = acc_sequential(a, b)
    c = bf16((acc * F32(0.37)).astype(F32) + bias)
    assert verdict(a, b, c, scale=np.float32(0.37), bias=bias).passed
    assert not verdict(a, b, c, scale=np.float32(0.37)).passed  # bias missing from the reference
    assert not verdict(a, b, bf16(acc + bias), scale=np.float32(0.37), bias=bias).passed


def test_fp16_and_fp32_formats():
    a, b = gemm_inputs()
    a16, b16 = a.astype(np.float16).astype(F32), b.astype(np.float16).astype(F32)
    c16 = acc_sequential(a16, b16).astype(np.float16).astype(F32)
    assert check("gemm", {"a": a16, "b": b16}, {"c": c16}, "f16").passed
    assert not check("gemm", {"a": a16, "b": b16}, {"c": bf16(c16)}, "f16", "f32").passed
    assert check("gemm", {"a": a, "b": b}, {"c": acc_blocked(a, b, 32)}, "bf16", "f32").passed


def test_bad_inputs_are_reported_not_failed():
    a, b = gemm_inputs()
    c = bf16(acc_sequential(a, b))
    with pytest.raises(BadInput, match="not representable in bf16"):
        verdict(a + F32(1e-3), b, c)
    with pytest.raises(BadInput, match="K must match"):
        verdict(a, b[:-1], c)
    with pytest.raises(BadInput, match="lack"):
        check("gemm", {"a": a}, {"c": c}, "bf16")
    with pytest.raises(BadInput, match="output 'c' holds values not representable"):
        verdict(a, b, acc_sequential(a, b))
    with pytest.raises(BadInput, match="no oracle for family"):
        check("conv", {}, {}, "bf16")
    with pytest.raises(BadInput, match="holds NaN"):
        a2 = a.copy()
        a2[0, 0] = np.nan
        verdict(a2, b, c)


def test_guard_band_formula_values():
    assert gamma(1) == pytest.approx(2.0**-23 / (1 - 2.0**-23))
    assert BF.spacing(np.array([1.0, 1.5, 2.0, 0.0]))[:3].tolist() == [2**-7, 2**-7, 2**-6]
    assert BF.round(np.array([1 + 2**-8, 1 + 3 * 2**-8])).tolist() == [1.0, 1 + 2**-6]  # ties to even
    assert FORMATS["f16"].round(np.array([70000.0])).tolist() == [np.inf]


def test_registered_families():
    assert {"gemm", "rmsnorm", "softmax", "attention"} <= set(oracles())


def _fp32_softmax(x):
    z = (x - x.max(-1, keepdims=True)).astype(F32)
    e = np.exp(z).astype(F32)
    return (e / e.sum(-1, keepdims=True, dtype=F32)).astype(F32)


def test_softmax_and_rmsnorm():
    rng = np.random.default_rng(2)
    x = bf16(rng.standard_normal((16, 300)) * 4)
    y = bf16(_fp32_softmax(x))
    assert check("softmax", {"x": x}, {"y": y}, "bf16").passed
    assert not check("softmax", {"x": x}, {"y": bf16(y * F32(1.01))}, "bf16").passed
    assert not check("softmax", {"x": x}, {"y": bf16(_fp32_softmax(x[:, ::-1])[:, ::-1].T.T[::-1])}, "bf16").passed
    w = bf16(1 + 0.1 * rng.standard_normal(300))
    rms = (x / np.sqrt(np.mean(x.astype(F32) ** 2, -1, keepdims=True) + F32(1e-6))).astype(F32)
    y = bf16(w * bf16(rms))  # HF rounds to the input dtype before the weight
    assert check("rmsnorm", {"x": x, "w": w}, {"y": y}, "bf16").passed
    assert not check("rmsnorm", {"x": x, "w": w}, {"y": bf16(rms)}, "bf16").passed  # weight forgotten
    assert not check("rmsnorm", {"x": x, "w": w, "eps": np.float32(1.0)}, {"y": y}, "bf16").passed


def _flash_like(q, k, v, causal):
    s = (q @ k.transpose(0, 1, 3, 2)).astype(F32) * F32(1 / np.sqrt(q.shape[-1]))
    if causal:
        sq, sk = s.shape[-2:]
        s = np.where(np.arange(sk)[None] > np.arange(sq)[:, None] + sk - sq, -np.inf, s).astype(F32)
    m = s.max(-1, keepdims=True)
    p = np.exp(s - m).astype(F32)
    return (bf16(p) @ v).astype(F32) / p.sum(-1, keepdims=True, dtype=F32)  # P rounded to bf16 for PV


@pytest.mark.parametrize("causal", [False, True])
def test_attention(causal):
    rng = np.random.default_rng(4)
    q, k, v = (bf16(rng.standard_normal((1, 2, 32, 64))) for _ in range(3))
    o = bf16(_flash_like(q, k, v, causal))
    inputs = {"q": q, "k": k, "v": v, "causal": np.array(causal)}
    assert check("attention", inputs, {"o": o}, "bf16").passed
    assert not check("attention", {**inputs, "causal": np.array(not causal)}, {"o": o}, "bf16").passed
    assert not check("attention", inputs, {"o": bf16(_flash_like(q, k, v[:, :, ::-1], causal))}, "bf16").passed
