"""RMSNorm (``y = x / sqrt(mean(x^2) + eps) * w`` over each row of ``rows x cols``): dimensions, seeded
inputs, work, and the torch yardstick. The float64 oracle is :mod:`mosaic.oracle.rmsnorm` (``eps`` is its
default, 1e-6, which the inputs do not carry)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from mosaic.families import inputs as dist
from mosaic.families.torch_call import TORCH_DTYPES, TorchCall
from mosaic.records import Family, Yardstick

DIMS = ("rows", "cols")
EPS = 1e-6  # mosaic.oracle.rmsnorm's default
DTYPES = ("bf16", "f16", "f32")
DISTRIBUTIONS = ("normal", "int", "large", "equal-rows", "denormal")
FLOOR = "max(4*rows*cols / peak, e*(2*rows*cols + cols) / bandwidth)"


def work(shape: Mapping[str, int], e: float) -> tuple[float, float]:
    """(FLOPs, bytes): about four operations per element; ``x`` read and ``y`` written once, ``w`` read once."""
    r, c = shape["rows"], shape["cols"]
    return 4.0 * r * c, e * (2.0 * r * c + c)


def make_inputs(shape: Mapping[str, int], dtype: str, seed: int, values: str) -> dict:
    """Seeded ``x`` (rows x cols) and ``w`` (cols) as float32 arrays representable in ``dtype``.

    ``w`` is ``1 + normal/4`` rounded (a trained norm's weights sit near one), integers in [-4, 4] for
    ``int``. ``large``: ``x`` of magnitude up to 2^(e+1) with the fp32 sum of ``cols`` squares below 2^126
    (e = 55 for bf16 at 8192 columns; f16's own range, e = 14, caps it, so a kernel squaring in f16
    overflows). ``equal-rows``: each row of ``x`` one value, so ``y`` is ``sign(x) * w`` up to eps.
    ``denormal``: ``x`` subnormal; ``y`` is then about ``x / sqrt(eps) * w``, normal numbers, so a kernel
    that flushes ``x`` to zero returns zeros and fails.
    """
    import numpy as np

    from mosaic.oracle.formats import ACCUMULATOR, fmt

    rows, cols = shape["rows"], shape["cols"]
    rng = np.random.default_rng(seed)
    f = fmt(dtype)
    if values == "int":
        x, w = dist.small_ints(rng, (rows, cols)), dist.small_ints(rng, (cols,))
        return {"x": x, "w": w}
    if values == "large":
        x = dist.magnitude(rng, (rows, cols), f, dist.large_exponent(f, (ACCUMULATOR.emax, np.log2(cols), 2)))
    elif values == "equal-rows":
        x = dist.equal_rows(rng, (rows, cols), f)
    elif values == "denormal":
        x = dist.subnormal(rng, (rows, cols), f)
    else:
        x = dist.normal(rng, (rows, cols), f)
    w = f.round(1.0 + rng.standard_normal(cols) / 4).astype(np.float32)
    return {"x": x, "w": w}


def torch_rmsnorm(inputs: Mapping[str, Any], dtype: str, device: str = "cuda") -> TorchCall:
    """``torch.nn.functional.rms_norm(x, (cols,), w, eps=1e-6)`` (torch's fused kernel on the GPU)."""
    import torch

    cols = inputs["x"].shape[-1] if "x" in inputs else 0
    return TorchCall(lambda x, w: torch.nn.functional.rms_norm(x, (cols,), w, eps=EPS), inputs, ("x", "w"),
                     dtype, "y", device, what="torch rmsnorm yardstick")


TORCH = Yardstick("torch", "torch.nn.functional.rms_norm(x, (cols,), w, eps=1e-6)", "torch", TORCH_DTYPES,
                  torch_rmsnorm, call="torch.nn.functional.rms_norm", title="torch rms_norm")

FAMILY = Family("rmsnorm", "y = x / sqrt(mean(x^2) + 1e-6) * w over each row", DIMS, work, floor=FLOOR,
                dtypes=DTYPES, distributions=DISTRIBUTIONS, make_inputs=make_inputs, oracle="rmsnorm",
                yardsticks=(TORCH,), example={"rows": 8, "cols": 256})
