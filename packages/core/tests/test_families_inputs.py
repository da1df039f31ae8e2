"""The families' input generators against the float64 oracle: every distribution of every built-in family in
every format is seeded, representable and checkable (a correct result passes); the adversarial ones do what
they claim (denormals are subnormal, all-equal rows give exactly uniform weights, large magnitudes overflow a
kernel that does not guard against them) and a kernel with the matching bug fails the oracle."""

import numpy as np
import pytest
from mosaic.errors import BadInput
from mosaic.families import get, make_inputs, parse_shape
from mosaic.families.inputs import DISTRIBUTIONS, is_subnormal
from mosaic.oracle import check, oracles
from mosaic.oracle.formats import FORMATS
from mosaic.records import KernelSpec

SHAPES = {"gemm": {"m": 16, "n": 8, "k": 64}, "rmsnorm": {"rows": 6, "cols": 64}, "softmax": {"rows": 6, "cols": 48},
          "attention": {"batch": 1, "seq": 16, "heads": 4, "head_dim": 16}}
DTYPES = ("bf16", "f16", "f32")
OUT = {"gemm": "c", "rmsnorm": "y", "softmax": "y", "attention": "o"}


def spec(family, dtype="bf16", **shape):
    return KernelSpec(family, {**SHAPES[family], **shape}, dtype, "pallas")


def reference(family, inputs, dtype):
    """The oracle's float64 expectation of the single output."""
    f = FORMATS[dtype]
    return oracles()[family].reference(inputs, f, f)[OUT[family]]


def correct(family, inputs, dtype):
    """What a correct kernel writes: the float64 reference rounded once to the output format."""
    return {OUT[family]: FORMATS[dtype].round(reference(family, inputs, dtype).expected).astype(np.float32)}


def test_every_builtin_family_declares_every_distribution_and_format():
    for name in SHAPES:
        f = get(name)
        assert f.make_inputs is not None and set(f.distributions) == set(DISTRIBUTIONS) and f.dtypes == DTYPES
        assert f.oracle == name and name in oracles()


@pytest.mark.parametrize("family", sorted(SHAPES))
@pytest.mark.parametrize("values", sorted(DISTRIBUTIONS))
@pytest.mark.parametrize("dtype", DTYPES)
def test_inputs_are_seeded_representable_and_a_correct_result_passes(family, values, dtype):
    s = spec(family, dtype)
    one, again, other = make_inputs(s, 3, values), make_inputs(s, 3, values), make_inputs(s, 4, values)
    assert set(one) == set(oracles()[family].reference.inputs)
    for name, arr in one.items():
        assert arr.dtype == np.float32 and np.isfinite(arr).all()
        assert np.array_equal(arr, again[name])
        assert FORMATS[dtype].representable(arr).all(), (name, values)
    assert any(not np.array_equal(one[n], other[n]) for n in one)  # the seed matters
    verdict = check(family, one, correct(family, one, dtype), dtype)
    assert verdict.passed, verdict.reason
    wrong = correct(family, one, dtype)
    out = wrong[OUT[family]]
    out.flat[out.size // 2] = FORMATS[dtype].round(out.flat[out.size // 2] * 2 + 1)  # far outside any band
    assert not check(family, one, wrong, dtype).passed


@pytest.mark.parametrize("dtype", DTYPES)
def test_int_inputs_are_small_integers_and_gemm_is_then_checked_bit_exactly(dtype):
    for family in SHAPES:
        for arr in make_inputs(spec(family, dtype), 0, "int").values():
            assert np.array_equal(arr, np.round(arr)) and np.abs(arr).max() <= 4
    inputs = make_inputs(spec("gemm", dtype), 0, "int")
    assert check("gemm", inputs, correct("gemm", inputs, dtype), dtype).outputs[0].exact_checked == 16 * 8


@pytest.mark.parametrize("dtype", DTYPES)
def test_denormal_inputs_are_subnormal_in_the_format(dtype):
    f = FORMATS[dtype]
    which = {"gemm": "a", "rmsnorm": "x", "softmax": "x", "attention": "v"}
    for family, name in which.items():
        arr = make_inputs(spec(family, dtype), 1, "denormal")[name]
        assert is_subnormal(arr, f).all(), (family, name)
        assert np.abs(arr).max() < 2.0**f.emin and np.abs(arr).min() >= f.tiny
        assert len(np.unique(arr)) >= min(arr.size // 4, 2 ** (f.precision - 1))  # many subnormals, not one


@pytest.mark.parametrize("dtype", DTYPES)
def test_a_kernel_that_flushes_denormal_inputs_to_zero_fails(dtype):
    for family, name in (("gemm", "a"), ("rmsnorm", "x")):
        inputs = make_inputs(spec(family, dtype), 2, "denormal")
        flushed = {**inputs, name: np.zeros_like(inputs[name])}
        ftz = correct(family, flushed, dtype)  # exact arithmetic, but on the flushed inputs
        assert check(family, inputs, correct(family, inputs, dtype), dtype).passed
        assert not check(family, inputs, ftz, dtype).passed, family
    inputs = make_inputs(spec("attention", dtype), 2, "denormal")
    ftz = correct("attention", {**inputs, "v": np.zeros_like(inputs["v"])}, dtype)
    # f16 subnormals are normal fp32 numbers, far above the oracle's absolute 2^-126: flushing them fails;
    # bf16/f32 subnormals are all below it, so the oracle (documented) lets a flushed output through
    assert check("attention", inputs, ftz, dtype).passed == (dtype != "f16")


def test_all_equal_rows_give_exactly_uniform_softmax_and_key_averages():
    for cols in (48, 64, 7):
        inputs = make_inputs(spec("softmax", rows=5, cols=cols), 0, "equal-rows")
        assert (inputs["x"] == inputs["x"][:, :1]).all() and len(np.unique(inputs["x"][:, 0])) > 1
        ref = reference("softmax", inputs, "bf16").expected
        assert np.array_equal(ref, np.full((5, cols), 1.0 / cols))  # exactly, in float64
    inputs = make_inputs(spec("attention"), 0, "equal-rows")
    assert (inputs["k"] == inputs["k"][:, :, :1, :]).all()
    o = reference("attention", inputs, "bf16").expected
    mean_v = inputs["v"].astype(np.float64).mean(axis=2, keepdims=True)
    np.testing.assert_allclose(o, np.broadcast_to(mean_v, o.shape), rtol=1e-12, atol=1e-15)
    causal = make_inputs(spec("attention", causal=1), 0, "equal-rows")
    o = reference("attention", causal, "bf16").expected
    prefix = np.cumsum(causal["v"].astype(np.float64), axis=2) / np.arange(1, 17)[:, None]
    np.testing.assert_allclose(o, prefix, rtol=1e-12, atol=1e-15)  # query i averages keys 0..i
    g = make_inputs(spec("gemm"), 0, "equal-rows")
    assert (reference("gemm", g, "bf16").expected == reference("gemm", g, "bf16").expected[:, :1]).all()


@pytest.mark.parametrize("dtype", DTYPES)
def test_large_softmax_overflows_a_kernel_that_does_not_subtract_the_maximum(dtype):
    inputs = make_inputs(spec("softmax", dtype), 0, "large")
    x = inputs["x"]
    assert (np.abs(x) > 88.8).all()  # every exp(x) over- or underflows in fp32 on its own
    with np.errstate(over="ignore", invalid="ignore", divide="ignore"):
        e = np.exp(x.astype(np.float32))
        naive = {"y": FORMATS[dtype].round(e / e.sum(axis=-1, keepdims=True)).astype(np.float32)}
    z = x - x.max(axis=-1, keepdims=True)
    stable = np.exp(z.astype(np.float32))
    good = {"y": FORMATS[dtype].round(stable / stable.sum(axis=-1, keepdims=True)).astype(np.float32)}
    assert check("softmax", inputs, good, dtype).passed
    assert not check("softmax", inputs, naive, dtype).passed
    band = reference("softmax", inputs, dtype).tolerance
    assert band.max() < 0.01  # the check of the largest probabilities stays tight


@pytest.mark.parametrize("dtype", DTYPES)
def test_large_magnitudes_use_the_range_and_stay_inside_it(dtype):
    f = FORMATS[dtype]
    g = make_inputs(spec("gemm", dtype), 0, "large")
    c = reference("gemm", g, dtype).expected
    assert np.abs(c).max() <= f.max_finite / 4 and np.abs(c).max() <= FORMATS["f32"].max_finite / 4
    assert np.abs(g["a"]).min() >= (2.0**56 if dtype != "f16" else 2.0**3)  # k = 64: far above 1
    r = make_inputs(spec("rmsnorm", dtype), 0, "large")
    assert (np.square(r["x"].astype(np.float64)).sum(axis=-1) < FORMATS["f32"].max_finite / 4).all()
    assert np.abs(r["x"]).min() >= (2.0**58 if dtype != "f16" else 2.0**14)
    if dtype == "f16":  # squares in f16 overflow: a kernel that reduces in the input format returns inf/NaN
        with np.errstate(over="ignore", invalid="ignore"):
            x16 = r["x"].astype(np.float16)
            y = x16 / np.sqrt(np.mean(x16 * x16, axis=-1, keepdims=True) + np.float16(1e-6)) * r["w"].astype(np.float16)
        assert not check("rmsnorm", r, {"y": y.astype(np.float32)}, dtype).passed
    a = make_inputs(spec("attention", dtype), 0, "large")
    scores = np.einsum("bhqd,bhkd->bhqk", a["q"].astype(np.float64), a["k"].astype(np.float64)) / 4
    assert (np.abs(scores) > 88.8).all()  # every score beyond exp's fp32 range
    assert np.abs(a["v"]).min() >= (2.0**100 if dtype != "f16" else 2.0**10)
    assert reference("attention", a, dtype).tolerance.max() / np.abs(a["v"]).max() < 0.02


def test_attention_shapes_carry_gqa_and_the_causal_flag():
    assert parse_shape("attention", "batch=2,seq=16,heads=8,head_dim=16,kv_heads=2,causal=1") == \
        {"batch": 2, "seq": 16, "heads": 8, "head_dim": 16, "kv_heads": 2, "causal": 1}
    assert parse_shape("attention", "batch=2,seq=16,heads=8,head_dim=16,kv_heads=8,causal=0") == \
        {"batch": 2, "seq": 16, "heads": 8, "head_dim": 16}  # defaults are dropped: one spelling per problem
    for bad, why in (("kv_heads=3", "must be a positive divisor of heads=8"), ("causal=2", "must be 0 or 1"),
                     ("kv_heads=0", "must be a positive divisor"), ("window=4", "optional: kv_heads, causal")):
        with pytest.raises(BadInput, match=why):
            parse_shape("attention", f"batch=2,seq=16,heads=8,head_dim=16,{bad}")
    inputs = make_inputs(spec("attention", heads=8, kv_heads=2, causal=1), 0, "normal")
    assert inputs["q"].shape == (1, 8, 16, 16) and inputs["k"].shape == inputs["v"].shape == (1, 2, 16, 16)
    assert inputs["causal"].dtype == bool and bool(inputs["causal"])
    assert "causal" not in make_inputs(spec("attention"), 0, "normal")
    out = correct("attention", inputs, "bf16")
    assert check("attention", inputs, out, "bf16").passed
    non_causal = correct("attention", {k: v for k, v in inputs.items() if k != "causal"}, "bf16")
    assert not check("attention", inputs, non_causal, "bf16").passed  # the mask is checked


def test_causal_and_gqa_change_the_floor():
    from mosaic.families import physical_floor_ns

    class Gpu:
        peak_bf16_tflops, peak_fp8_tflops, hbm_bandwidth_gbs = 1000.0, 2000.0, 4000.0

    full = {"batch": 1, "seq": 4096, "heads": 32, "head_dim": 128}
    dense = physical_floor_ns("attention", full, "bf16", Gpu())
    assert dense == pytest.approx(4 * 32 * 4096**2 * 128 / 1e15 * 1e9)
    assert physical_floor_ns("attention", {**full, "causal": 1}, "bf16", Gpu()) == pytest.approx(dense * 4097 / 8192)
    tall = {"batch": 64, "seq": 128, "heads": 32, "head_dim": 128}  # memory bound
    gqa = physical_floor_ns("attention", {**tall, "kv_heads": 8}, "bf16", Gpu())
    assert gqa == pytest.approx(2 * 2 * 64 * 128 * 128 * (32 + 8) / 4e12 * 1e9)


def test_unknown_distributions_and_formats_are_one_line_errors():
    with pytest.raises(BadInput, match="family 'softmax' has no value distribution 'uniform'; it has: normal"):
        make_inputs(spec("softmax"), 0, "uniform")
    with pytest.raises(BadInput, match="generates inputs in bf16, f16, f32, not fp8_e4m3"):
        make_inputs(KernelSpec("gemm", SHAPES["gemm"], "fp8_e4m3", "cutlass"), 0, "normal")
    with pytest.raises(BadInput, match="unknown family 'conv2d'; known: attention, gemm, rmsnorm, softmax"):
        make_inputs(KernelSpec("conv2d", {"n": 1}, "bf16", "cutlass"), 0, "normal")
