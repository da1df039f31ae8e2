"""Kernel-family facts (mosaic.families): one record per family, the shape parser, inputs, the physical floor
and the yardstick hook, read from the registry rather than from if/elif chains."""

import pytest
from mosaic.errors import BadInput, MosaicError
from mosaic.families import (
    DTYPE_BYTES,
    YARDSTICK,
    dims,
    get,
    make_inputs,
    parse_shape,
    physical_floor_ns,
    registry,
    yardstick_runnable,
)
from mosaic.oracle.builtin import BUILTIN
from mosaic.records import DTYPES, KernelSpec


class Gpu:
    peak_bf16_tflops = 1000.0
    peak_fp8_tflops = 2000.0
    hbm_bandwidth_gbs = 4000.0


def test_every_family_with_a_builtin_oracle_has_its_facts_and_none_more():
    assert set(registry()) == set(BUILTIN)
    for name, f in registry().items():
        assert f.name == name and dims(name) == f.dims and len(set(f.dims)) == len(f.dims)
    assert dims("conv2d") is None
    assert set(DTYPE_BYTES) == set(DTYPES)


def test_positional_shapes_follow_each_familys_dimension_order():
    assert parse_shape("gemm", "64x32x16") == {"m": 64, "n": 32, "k": 16}
    assert parse_shape("rmsnorm", "8x128") == {"rows": 8, "cols": 128}
    assert parse_shape("attention", "2x128x4x64") == {"batch": 2, "seq": 128, "heads": 4, "head_dim": 64}
    with pytest.raises(BadInput, match="needs 2 dimensions"):
        parse_shape("softmax", "8x128x4")
    with pytest.raises(BadInput, match="no default dimension order"):
        parse_shape("conv2d", "8x8")


def test_the_physical_floor_is_the_larger_of_compute_and_memory_time():
    gpu = Gpu()
    m = n = k = 1024
    compute = 2.0 * m * n * k / 1e15 * 1e9
    memory = 2 * (m * k + k * n + m * n) / 4e12 * 1e9
    assert physical_floor_ns("gemm", {"m": m, "n": n, "k": k}, "bf16", gpu) == pytest.approx(max(compute, memory))
    assert physical_floor_ns("gemm", {"m": m, "n": n, "k": k}, "fp8_e4m3", gpu) < compute  # fp8 peak, 1-byte data
    rows = {"rows": 4096, "cols": 4096}
    assert physical_floor_ns("softmax", rows, "bf16", gpu) == pytest.approx(2 * 2 * 4096 * 4096 / 4e12 * 1e9)
    assert physical_floor_ns("rmsnorm", rows, "bf16", gpu) == pytest.approx(2 * (2 * 4096 * 4096 + 4096) / 4e12 * 1e9)
    # memory bound: x read once, y written once (rmsnorm also reads its cols weights)
    assert physical_floor_ns("conv2d", {"n": 1}, "bf16", gpu) == 0.0


def test_every_builtin_family_generates_inputs_and_names_its_yardsticks():
    spec = KernelSpec("gemm", {"m": 8, "n": 4, "k": 6}, "bf16", "cutlass")
    a = make_inputs(spec, 0, "normal")
    assert a["a"].shape == (8, 6) and a["b"].shape == (6, 4)
    x = make_inputs(KernelSpec("softmax", {"rows": 2, "cols": 8}, "bf16", "pallas"), 0, "normal")["x"]
    assert x.shape == (2, 8)
    assert YARDSTICK == "cublas"
    assert [y.name for y in get("gemm").yardsticks] == ["cublas"]
    assert [y.name for y in get("attention").yardsticks] == ["torch-sdpa", "sdpa-flash", "cudnn",
                                                                 "flash-attn-4"]
    with pytest.raises(MosaicError, match="the cublas yardstick covers gemm, not attention"):
        yardstick_runnable(KernelSpec("attention", {"batch": 1, "seq": 8, "heads": 1, "head_dim": 8}, "bf16",
                                      YARDSTICK), {})


# -- the parser and the generators under arbitrary input ------------------------------------------------------

from hypothesis import HealthCheck, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

_TEXT = st.one_of(st.text(max_size=60), st.from_regex(r"\d{1,3}(x\d{1,3}){0,4}", fullmatch=True),
                  st.lists(st.tuples(st.sampled_from(["batch", "seq", "heads", "head_dim", "kv_heads", "causal", "m",
                                                      "rows", "x"]), st.integers(-3, 20)), max_size=7)
                  .map(lambda kv: ",".join(f"{k}={v}" for k, v in kv)))


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(family=st.sampled_from(["gemm", "attention", "rmsnorm", "softmax", "conv2d"]), text=_TEXT)
def test_any_shape_text_parses_to_a_valid_shape_or_one_bad_input(family, text):
    try:
        shape = parse_shape(family, text)
    except BadInput as exc:
        assert "\n" not in exc.line()
        return
    assert all(isinstance(v, int) and 1 <= v <= 2**40 for v in shape.values())
    if family != "conv2d":
        f = get(family)
        assert set(f.dims) <= set(shape) <= set(f.dims) | set(f.optional_dims)
        assert parse_shape(family, shape) == shape  # canonical: parsing again changes nothing
        KernelSpec(family, shape, "bf16", "pallas")  # and a KernelSpec takes it


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(b=st.integers(1, 2), s=st.integers(1, 24), kv=st.integers(1, 4), ratio=st.integers(1, 3),
       d=st.sampled_from([4, 8, 16]), causal=st.booleans(), seed=st.integers(0, 2**32 - 1),
       values=st.sampled_from(["normal", "int", "large", "equal-rows", "denormal"]),
       dtype=st.sampled_from(["bf16", "f16", "f32"]))
def test_attention_inputs_of_any_gqa_shape_are_checkable(b, s, kv, ratio, d, causal, seed, values, dtype):
    import numpy as np
    from mosaic.oracle import check, oracles
    from mosaic.oracle.formats import FORMATS

    shape = parse_shape("attention", {"batch": b, "seq": s, "heads": kv * ratio, "head_dim": d, "kv_heads": kv,
                                      "causal": int(causal)})
    inputs = make_inputs(KernelSpec("attention", shape, dtype, "pallas"), seed, values)
    assert inputs["q"].shape == (b, kv * ratio, s, d) and inputs["k"].shape == inputs["v"].shape == (b, kv, s, d)
    assert ("causal" in inputs) == causal
    f = FORMATS[dtype]
    ref = oracles()["attention"].reference(inputs, f, f)["o"].expected
    assert check("attention", inputs, {"o": f.round(ref).astype(np.float32)}, dtype).passed


def test_every_builtin_family_passes_its_conformance_checks():
    from mosaic.families.conformance import check_family

    for f in registry().values():
        assert f.example and check_family(f) == [], f.name


def test_registry_hands_out_a_copy_the_caller_cannot_change_the_registry_through():
    import mosaic.families as families

    mine = registry()
    del mine["gemm"]
    mine["conv2d"] = get("softmax")
    assert "gemm" in registry() and get("conv2d") is None and get("gemm").name == "gemm"
    assert not hasattr(families, "FAMILIES")  # the old module-level view is gone: registry()/get() only
