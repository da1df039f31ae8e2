"""The physical floor of a problem on a GPU: the larger of its compute time at peak and its memory time at
full bandwidth, from the family's (FLOPs, bytes) and the GpuTarget's figures."""

from __future__ import annotations

from collections.abc import Mapping

from mosaic.records import Family

#: bytes per element of each number format (the physical floor's memory traffic)
DTYPE_BYTES = {"f64": 8, "f32": 4, "tf32": 4, "f16": 2, "bf16": 2, "fp8_e4m3": 1, "fp8_e5m2": 1, "i8": 1,
               "i4": 0.5, "i32": 4}


def dtype_bytes(dtype: str) -> float:
    """Bytes per element of ``dtype`` (2 for a format the table does not know)."""
    return DTYPE_BYTES.get(dtype, 2)


def peak_tflops(dtype: str, gpu) -> float:
    """The dense tensor-core peak the floor divides by: fp8's for fp8 formats, bf16's otherwise."""
    return gpu.peak_fp8_tflops if dtype.startswith("fp8") else gpu.peak_bf16_tflops


def floor_ns(family: Family, shape: Mapping[str, int], dtype: str, gpu) -> float:
    """max(flops / peak, bytes / bandwidth) in nanoseconds for ``shape`` of ``family`` on ``gpu``."""
    flops, nbytes = family.work(dict(shape), dtype_bytes(dtype))
    return max(flops / (peak_tflops(dtype, gpu) * 1e12), nbytes / (gpu.hbm_bandwidth_gbs * 1e9)) * 1e9
