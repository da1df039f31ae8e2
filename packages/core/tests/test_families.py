"""Kernel-family facts (mosaic.families): one record per family, the shape parser, inputs, the physical floor
and the yardstick hook, read from the registry rather than from if/elif chains."""

import pytest
from mosaic.errors import BadInput, MosaicError
from mosaic.families import (
    DTYPE_BYTES,
    FAMILIES,
    YARDSTICK,
    dims,
    make_inputs,
    parse_shape,
    physical_floor_ns,
    yardstick_runnable,
)
from mosaic.oracle.builtin import BUILTIN
from mosaic.records import DTYPES, KernelSpec


class Gpu:
    peak_bf16_tflops = 1000.0
    peak_fp8_tflops = 2000.0
    hbm_bandwidth_gbs = 4000.0


def test_every_family_with_a_builtin_oracle_has_its_facts_and_none_more():
    assert set(FAMILIES) == set(BUILTIN)
    for name, f in FAMILIES.items():
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
    assert [y.name for y in FAMILIES["gemm"].yardsticks] == ["cublas"]
    assert [y.name for y in FAMILIES["attention"].yardsticks] == ["torch-sdpa", "cudnn", "flash-attn-4"]
    with pytest.raises(MosaicError, match="the cublas yardstick covers gemm, not attention"):
        yardstick_runnable(KernelSpec("attention", {"batch": 1, "seq": 8, "heads": 1, "head_dim": 8}, "bf16",
                                      YARDSTICK), {})
