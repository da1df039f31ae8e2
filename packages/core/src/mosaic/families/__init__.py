"""Kernel-family facts, one module per family: dimensions and the shape parser, seeded inputs, the work
(FLOPs and bytes) behind the physical floor, element sizes, and the yardstick hook.

``FAMILIES`` maps a family name to its :class:`~mosaic.families.family.Family`. The float64 oracles stay in
:mod:`mosaic.oracle` (a plugin registry of their own). A new family is a module here with a ``FAMILY``
record, added to ``FAMILIES``.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from mosaic.errors import BadInput, MosaicError
from mosaic.families import attention, gemm, rmsnorm, softmax
from mosaic.families.family import DTYPE_BYTES, Family, dtype_bytes

FAMILIES: dict[str, Family] = {f.name: f for f in (gemm.FAMILY, rmsnorm.FAMILY, softmax.FAMILY, attention.FAMILY)}
YARDSTICK = gemm.CUBLAS  # the yardstick's language name (a library call, no lowering)

__all__ = ["FAMILIES", "YARDSTICK", "DTYPE_BYTES", "Family", "dtype_bytes", "dims", "parse_shape", "make_inputs",
           "physical_floor_ns", "yardstick_runnable"]


def dims(family: str) -> tuple[str, ...] | None:
    """The family's dimension names in ``--shape AxBxC`` order (None for a family core does not know)."""
    f = FAMILIES.get(family)
    return f.dims if f is not None else None


MAX_DIM = 2**40  # one problem dimension (a bound on hostile shapes, far above any kernel's)
MAX_SHAPE_TEXT = 200  # characters of a shape written as text


def parse_shape(family: str, shape: Any, where: str = "--shape") -> dict[str, int]:
    """``4096x4096x4096`` (dimension order of the family), ``m=4096,n=4096,k=4096`` or a mapping."""
    if isinstance(shape, str) and len(shape) > MAX_SHAPE_TEXT:
        raise BadInput(f"a shape of {len(shape):,} characters is over the limit of {MAX_SHAPE_TEXT}", where)
    if isinstance(shape, Mapping):
        out = dict(shape)
    elif isinstance(shape, str) and "=" in shape:
        out = {}
        for part in shape.split(","):
            name, _, value = part.partition("=")
            out[name.strip()] = _int(value, where)
    elif isinstance(shape, str) and re.fullmatch(r"\d+(x\d+)*", shape.strip()):
        values = [_int(v, where) for v in shape.strip().split("x")]
        names = dims(family)
        if names is None:
            raise BadInput(f"family '{family}' has no default dimension order; write the shape as name=value,...",
                           where)
        if len(values) != len(names):
            raise BadInput(f"{family} shape needs {len(names)} dimensions ({'x'.join(names)}), got {shape!r}", where)
        out = dict(zip(names, values, strict=True))
    else:
        raise BadInput(f"shape {shape!r} is not AxBxC, name=value,... or a table", where)
    for k, v in out.items():
        if isinstance(v, bool) or not isinstance(v, int) or v < 1:
            raise BadInput(f"shape dimension {str(k)[:40]}={_show(v)} must be a positive integer", where)
        if v > MAX_DIM:
            raise BadInput(f"shape dimension {str(k)[:40]}={_show(v)} is over the limit of 2**40", where)
    names = dims(family)
    if names is not None and set(out) != set(names):
        raise BadInput(f"{family} shape needs dimensions {', '.join(names)}; got {', '.join(sorted(out))}", where)
    return out


def _int(text: str, where: str) -> int:
    try:
        return int(text.strip())
    except ValueError:
        raise BadInput(f"shape value {text[:40]!r} is not an integer", where) from None


def _show(v: Any) -> str:
    text = repr(v) if not isinstance(v, int) or abs(v) < 10**30 else f"<an integer of {len(str(abs(v)))} digits>"
    return text if len(text) <= 60 else text[:57] + "..."


def make_inputs(spec, seed: int, values: str) -> dict:
    """Seeded inputs for ``spec``'s family, as float32 arrays representable in ``spec.dtype``
    (``values``: ``normal`` or ``int``; see the family's ``make_inputs``)."""
    f = FAMILIES.get(spec.family)
    if f is None or f.make_inputs is None:
        raise BadInput(f"capture has no input generator for family '{spec.family}' yet", "--family")
    return f.make_inputs(spec.shape, spec.dtype, seed, values)


def physical_floor_ns(family: str, shape: Mapping[str, int], dtype: str, gpu) -> float:
    """max(flops / peak, bytes / bandwidth) for the problem on the GPU record (0 when the family is unknown)."""
    f = FAMILIES.get(family)
    if f is None:
        return 0.0
    flops, nbytes = f.work(dict(shape), dtype_bytes(dtype))
    peak = gpu.peak_fp8_tflops if dtype.startswith("fp8") else gpu.peak_bf16_tflops
    return max(flops / (peak * 1e12), nbytes / (gpu.hbm_bandwidth_gbs * 1e9)) * 1e9


def yardstick_runnable(spec, inputs: Mapping[str, Any]):
    """The yardstick's Runnable (cuBLAS) for ``spec``'s problem on these inputs."""
    f = FAMILIES.get(spec.family)
    if f is None or f.yardstick is None:
        covers = ", ".join(n for n, x in FAMILIES.items() if x.yardstick is not None)
        raise MosaicError(f"the cuBLAS yardstick covers {covers}, not {spec.family}", "yardstick")
    return f.yardstick(inputs, spec.dtype)
