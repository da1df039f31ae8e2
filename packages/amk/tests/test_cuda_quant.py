"""The CUDA VM's quantized micro-kernels (kernels/gemv_quant.cuh) against the ReferenceVM's ops (quant.py) on the GPU
(marked ``gpu``): in float32 mode a quantized GEMV, gate/up GEMV and embedding row are bit-identical to ops.KERNELS on
the same x, for int8, q8_0 and q4_1, split over the 132 SMs, in the default build and the GEMV build variants (body 2,
the weight preload, the weight stream: each falls back to the quantized path for these weights)."""

from __future__ import annotations

import numpy as np
import pytest
from mosaic_amk import ops, quant
from mosaic_amk.bench.microbench import op_schedule, split_rows
from mosaic_amk.schedule import Buffer

pytestmark = pytest.mark.gpu
SMS = 132
F32 = np.float32
BUILDS = [(), ("AMK_GEMV_IMPL=2",), ("AMK_WEIGHT_PRELOAD=8",), ("AMK_WSTREAM=4",)]


def _tensor(fmt: str, rows: int, cols: int, seed: int) -> quant.QuantizedTensor:
    w = (np.random.default_rng(seed).standard_normal((rows, cols)) * 0.05).astype(F32)
    if fmt == "int8":
        return quant.quantize_int8(w)
    import gguf

    kind = {"q8_0": gguf.GGMLQuantizationType.Q8_0, "q4_1": gguf.GGMLQuantizationType.Q4_1}[fmt]
    return quant.from_gguf_blocks(fmt, gguf.quants.quantize(w, kind), w.shape)


def _run(schedule, weights, inputs, out, defines=(), quant_build=True):
    import cupy as cp
    from mosaic_amk.cuda import encode as E
    from mosaic_amk.cuda.build import build, ring_bytes
    from mosaic_amk.cuda.launcher import Launcher, gate

    gate(schedule, False)
    defines = tuple(defines) + (("AMK_QUANT=1",) if quant_build else ())
    lz = Launcher(E.encode(schedule, runtime_position=False), str(build(512, defines=defines).cubin), threads=512,
                  mode="f32", ring_bytes=ring_bytes(512, defines))
    lz.bind(weights, inputs)
    lz.launch()
    lz.check()
    return cp.asnumpy(lz.dev[out]).astype(F32)


def _same_bits(a, b) -> bool:
    return a.shape == b.shape and np.array_equal(a.view(np.uint32), b.view(np.uint32))


@pytest.mark.parametrize("defines", BUILDS, ids=lambda d: d[0] if d else "default")
@pytest.mark.parametrize("fmt", quant.FORMATS)
@pytest.mark.parametrize("n,k", [(1536, 576), (576, 1536), (2048, 8192)])
def test_quantized_gemv_is_bit_identical_to_the_reference_vm(fmt, n, k, defines, cuda_device):
    w = _tensor(fmt, n, k, seed=n + k)
    x = np.random.default_rng(7).standard_normal(k).astype(F32)
    bufs = [Buffer("x", "f32", (k,), "input"), Buffer("w", fmt, (n, k), "weight"), Buffer("y", "f32", (n,), "output")]
    s = op_schedule("gemv", bufs, ["x", "w"], ["y"], {"bias": False, "residual": False}, SMS, split_rows(n, SMS),
                    ["w", "y"])
    ref = np.full(n, np.nan, F32)
    ops.op_gemv([x, w], [ref], {"row_start": 0, "row_end": n, "bias": False, "residual": False})
    got = _run(s, {"w": w}, {"x": x}, "y", defines)
    assert _same_bits(got, ref), (fmt, int(np.sum(got != ref)), float(np.max(np.abs(got - ref))))


@pytest.mark.parametrize("fmt", quant.FORMATS)
def test_quantized_gate_up_gemv_is_bit_identical(fmt, cuda_device):
    n, k = 1536, 576
    wg, wu = _tensor(fmt, n, k, 1), _tensor(fmt, n, k, 2)
    x = np.random.default_rng(8).standard_normal(k).astype(F32)
    bufs = [Buffer("x", "f32", (k,), "input"), Buffer("wg", fmt, (n, k), "weight"),
            Buffer("wu", fmt, (n, k), "weight"), Buffer("y", "f32", (n,), "output")]
    s = op_schedule("gemv_silu_mul", bufs, ["x", "wg", "wu"], ["y"], {"bias": False}, SMS, split_rows(n, SMS),
                    ["wg", "wu", "y"])
    ref = np.full(n, np.nan, F32)
    ops.op_gemv_silu_mul([x, wg, wu], [ref], {"row_start": 0, "row_end": n, "bias": False})
    got = _run(s, {"wg": wg, "wu": wu}, {"x": x}, "y")
    # the dot products are bit-identical; silu's expf on the device may differ from numpy's exp by an ulp
    assert np.allclose(got, ref, rtol=2e-6, atol=1e-7), float(np.max(np.abs(got - ref)))


@pytest.mark.parametrize("fmt", quant.FORMATS)
def test_quantized_embedding_row_is_bit_identical(fmt, cuda_device):
    v, h = 4096, 576
    table = _tensor(fmt, v, h, 3)
    bufs = [Buffer("table", fmt, (v, h), "weight"), Buffer("token", "i32", (1,), "input"),
            Buffer("x", "f32", (h,), "output")]
    s = op_schedule("embed", bufs, ["table", "token"], ["x"], {}, 1)
    for tok in (0, 1234, v - 1):
        ref = np.full(h, np.nan, F32)
        ops.op_embed([table, np.array([tok], np.int32)], [ref], {})
        got = _run(s, {"table": table}, {"token": np.array([tok], np.int32)}, "x")
        assert _same_bits(got, ref), (fmt, tok)


def test_a_quantized_weight_on_the_bf16_build_is_an_error_not_bf16(cuda_device):
    """The default build leaves the quantized paths out (AMK_QUANT=0): a quantized weight reaching it sets E_QUANT,
    which the launcher's check reports, instead of its bytes being read as bf16."""
    n, k = 576, 576
    w = _tensor("q8_0", n, k, seed=3)
    x = np.random.default_rng(9).standard_normal(k).astype(F32)
    bufs = [Buffer("x", "f32", (k,), "input"), Buffer("w", "q8_0", (n, k), "weight"), Buffer("y", "f32", (n,), "output")]
    s = op_schedule("gemv", bufs, ["x", "w"], ["y"], {"bias": False, "residual": False}, SMS, split_rows(n, SMS),
                    ["w", "y"])
    with pytest.raises(Exception, match="AMK_QUANT"):
        _run(s, {"w": w}, {"x": x}, "y", quant_build=False)
