"""The oracle's comparison taken in chunks (mosaic.oracle.verdict.compare, _first_unrepresentable) reports what the
whole-array comparison reports: the same counts, first indices, worst element and statistics, whatever the chunk."""

import json

import numpy as np
import pytest
from mosaic.oracle import _first_unrepresentable, check
from mosaic.oracle.formats import fmt
from mosaic.oracle.verdict import Expectation, compare


def _case(seed=0, shape=(37, 53), exact=False):
    rng = np.random.default_rng(seed)
    ref = rng.standard_normal(shape)
    tol = np.abs(ref) * 1e-2 + 1e-3
    got = ref + rng.standard_normal(shape) * 2e-3
    ex = xv = None
    if exact:
        ex = rng.random(shape) < 0.2
        xv = np.where(ex, got, 0.0)
    return got, Expectation(ref, tol, fmt("f32"), "test", ex, xv)


def _fields(r):
    d = r.to_json()
    mean = d.pop("mean_abs_error")
    return d, mean


@pytest.mark.parametrize("chunk", [1, 7, 64, 1000, 1 << 20])
@pytest.mark.parametrize("spoil", ["none", "band", "nan", "inf", "exact", "zero-band"])
def test_chunks_report_what_one_pass_reports(chunk, spoil):
    got, exp = _case(exact=spoil == "exact")
    if spoil == "band":
        got[5, 7] += 1.0
        got[30, 2] += 3.0  # the worst
        got[31, 2] += 3.0 * exp.tolerance[31, 2] / exp.tolerance[30, 2] * 0.5
    elif spoil == "nan":
        got[3, 4] = np.nan
        got[20, 1] = np.nan
    elif spoil == "inf":
        got[9, 9] = np.inf
    elif spoil == "exact":
        where = np.argwhere(exp.exact)
        for i in (3, 10):
            got[tuple(where[i])] += 1e-9
    elif spoil == "zero-band":
        exp = Expectation(exp.expected, np.where(np.arange(got.size).reshape(got.shape) == 100, 0.0, exp.tolerance),
                          exp.out_format, exp.formula)
        got[np.unravel_index(100, got.shape)] += 1e-6
    whole, mean_whole = _fields(compare("y", got, exp, chunk=got.size))
    parts, mean_parts = _fields(compare("y", got, exp, chunk=chunk))
    assert json.dumps(parts, sort_keys=True) == json.dumps(whole, sort_keys=True)  # NaN fields compare as text
    assert (mean_parts is None) == (mean_whole is None)
    if mean_whole is not None:
        assert mean_parts == pytest.approx(mean_whole, rel=1e-12)
    if spoil == "band":
        assert whole["worst_index"] == [30, 2] and whole["failures"] >= 2
    if spoil == "nan":
        assert "first NaN at (3, 4)" in whole["reason"] and whole["nonfinite"] == 2
    if spoil == "exact":
        assert whole["exact_mismatches"] == 2 and not whole["passed"]
    if spoil == "zero-band":
        assert whole["worst_index"] == list(np.unravel_index(100, got.shape))


def test_the_one_pass_figures_are_the_element_by_element_ones():
    got, exp = _case(seed=3)
    got[2, 2] += 1.0
    r = compare("y", got, exp, chunk=5)
    err = np.abs(got - exp.expected)
    assert r.failures == int((err > exp.tolerance).sum())
    assert r.max_abs_error == float(err.max())
    assert r.worst_index == tuple(int(i) for i in np.unravel_index(np.argmax(err / exp.tolerance), got.shape))
    assert r.mean_abs_error == pytest.approx(float(err.mean()), rel=1e-12)


@pytest.mark.parametrize("chunk", [1, 3, 100, 1 << 20])
def test_first_unrepresentable_in_chunks(chunk):
    f = fmt("bf16")
    a = f.round(np.random.default_rng(1).standard_normal((17, 19))).astype(np.float32)
    assert _first_unrepresentable(a, f, chunk) is None
    a[4, 6] = np.float32(1.0 + 2.0 ** -12)
    a[9, 1] = np.float32(1.0 + 2.0 ** -12)
    assert _first_unrepresentable(a, f, chunk) == (4, 6)
    assert _first_unrepresentable(np.float32(1.5), f, chunk) is None


def test_check_through_the_chunks_at_a_gate_size():
    """An rmsnorm gate of 2048 x 1024 (2^21 elements: two chunks) passes on the rounded reference and fails on one
    element outside the band, at that element."""
    from mosaic.families import make_inputs
    from mosaic.oracle import rmsnorm
    from mosaic.records import KernelSpec

    spec = KernelSpec(family="rmsnorm", shape={"rows": 2048, "cols": 1024}, dtype="bf16", language="pallas", knobs={})
    inputs = make_inputs(spec, 0, "normal")
    ref = rmsnorm.reference(inputs, fmt("bf16"), fmt("bf16"))["y"]
    y = fmt("bf16").round(ref.expected).astype(np.float32)
    assert check("rmsnorm", inputs, {"y": y}, "bf16").passed
    y[1500, 700] = fmt("bf16").round(np.float64(y[1500, 700]) * 1.5 + 1.0)
    v = check("rmsnorm", inputs, {"y": y}, "bf16")
    assert not v.passed and v.outputs[0].failures == 1 and v.outputs[0].worst_index == (1500, 700)


def test_round_in_chunks_is_the_element_wise_round():
    from mosaic.oracle.formats import ROUND_CHUNK

    rng = np.random.default_rng(2)
    x = rng.standard_normal(2 * ROUND_CHUNK + 5) * np.exp2(rng.integers(-140, 140, 2 * ROUND_CHUNK + 5))
    x[[0, 7, -1]] = [np.nan, np.inf, -3e39]
    for name in ("bf16", "f16", "f32"):
        f = fmt(name)
        got = f.round(x.reshape(-1, 5) if x.size % 5 == 0 else x)
        want = f._round(x)
        assert got.shape == x.shape and np.array_equal(got.ravel(), want, equal_nan=True)


def test_rmsnorm_reference_in_row_chunks_is_the_whole_array_one(monkeypatch):
    from mosaic.oracle import rmsnorm

    rng = np.random.default_rng(4)
    f = fmt("bf16")
    x = f.round(rng.standard_normal((5, 37, 96))).astype(np.float32)
    w = f.round(1 + rng.standard_normal(96) / 4).astype(np.float32)
    monkeypatch.setattr(rmsnorm, "ROW_CHUNK_ELEMENTS", 1 << 30)
    whole = rmsnorm.reference({"x": x, "w": w}, f, f)["y"]
    monkeypatch.setattr(rmsnorm, "ROW_CHUNK_ELEMENTS", 96 * 7)  # 7 rows a chunk: 185 rows end mid-chunk
    parts = rmsnorm.reference({"x": x, "w": w}, f, f)["y"]
    assert parts.expected.shape == x.shape
    assert np.array_equal(parts.expected, whole.expected) and np.array_equal(parts.tolerance, whole.tolerance)
    X = x.astype(np.float64)
    assert np.array_equal(whole.expected, X / np.sqrt(np.mean(X * X, axis=-1, keepdims=True) + 1e-6) * w)


def test_an_unwritable_cache_root_keeps_the_reference_in_memory(tmp_path):
    from mosaic.families import make_inputs
    from mosaic.oracle.cache import ReferenceCache
    from mosaic.records import KernelSpec

    blocker = tmp_path / "file"
    blocker.write_text("not a directory")
    spec = KernelSpec(family="rmsnorm", shape={"rows": 8, "cols": 64}, dtype="bf16", language="pallas", knobs={})
    inputs = make_inputs(spec, 0, "normal")
    from mosaic.oracle import rmsnorm

    y = fmt("bf16").round(rmsnorm.reference(inputs, fmt("bf16"), fmt("bf16"))["y"].expected).astype(np.float32)
    cache = ReferenceCache(blocker / "oracle")  # its parent is a file: nothing can be stored under it
    assert check("rmsnorm", inputs, {"y": y}, "bf16", cache=cache).passed
    assert cache.last["source"] == "computed" and cache.last["stored"].startswith("not stored")
    assert check("rmsnorm", inputs, {"y": y}, "bf16", cache=cache).passed and cache.last["source"] == "cache-memory"
