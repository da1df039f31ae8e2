"""Softmax over each row of ``rows x cols``: dimensions, seeded inputs, work, and the torch yardstick.
The float64 oracle is :mod:`mosaic.oracle.softmax`."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from mosaic.families import inputs as dist
from mosaic.families.torch_call import TORCH_DTYPES, TorchCall
from mosaic.records import Family, Yardstick

DIMS = ("rows", "cols")
DTYPES = ("bf16", "f16", "f32")
DISTRIBUTIONS = ("normal", "int", "large", "equal-rows", "denormal")
FLOOR = "max(4*rows*cols / peak, e*2*rows*cols / bandwidth)"


def work(shape: Mapping[str, int], e: float) -> tuple[float, float]:
    """(FLOPs, bytes): about four operations per element; the input read and the output written once."""
    return 4.0 * shape["rows"] * shape["cols"], 2.0 * e * shape["rows"] * shape["cols"]


def make_inputs(shape: Mapping[str, int], dtype: str, seed: int, values: str) -> dict:
    """Seeded ``x`` (rows x cols) as a float32 array representable in ``dtype``.

    ``large``: each row is ``+-2^8 + 8 * normal`` (the sign drawn per row): every value is beyond exp's
    fp32 range (exp(88.8) overflows, exp(-103) is zero), while the spread within a row stays moderate, so
    the oracle's band stays tight and a kernel that does not subtract the row maximum returns inf or NaN.
    ``equal-rows``: each row one value: the float64 reference is exactly uniform, 1/cols.
    ``denormal``: subnormal values (the output is uniform up to 2^-126; they must not produce NaN).
    """
    import numpy as np

    from mosaic.oracle.formats import fmt

    rows, cols = shape["rows"], shape["cols"]
    rng = np.random.default_rng(seed)
    f = fmt(dtype)
    if values == "int":
        x = dist.small_ints(rng, (rows, cols))
    elif values == "large":
        sign = np.where(rng.random((rows, 1)) < 0.5, -1.0, 1.0)
        x = f.round(sign * dist.SCORE_OFFSET + 8.0 * rng.standard_normal((rows, cols))).astype(np.float32)
    elif values == "equal-rows":
        x = dist.equal_rows(rng, (rows, cols), f)
    elif values == "denormal":
        x = dist.subnormal(rng, (rows, cols), f)
    else:
        x = dist.normal(rng, (rows, cols), f)
    return {"x": x}


def torch_softmax(inputs: Mapping[str, Any], dtype: str, device: str = "cuda") -> TorchCall:
    """``torch.softmax(x, dim=-1)`` (fp32 internally for half formats)."""
    import torch

    return TorchCall(lambda x: torch.softmax(x, dim=-1), inputs, ("x",), dtype, "y", device,
                     what="torch softmax yardstick")


TORCH = Yardstick("torch", "torch.softmax(x, dim=-1)", "torch", TORCH_DTYPES, torch_softmax, call="torch.softmax",
                  title="torch softmax")

FAMILY = Family("softmax", "y = exp(x - max) / sum(exp(x - max)) over each row", DIMS, work, floor=FLOOR,
                dtypes=DTYPES, distributions=DISTRIBUTIONS, make_inputs=make_inputs, oracle="softmax",
                yardsticks=(TORCH,), example={"rows": 8, "cols": 256})
