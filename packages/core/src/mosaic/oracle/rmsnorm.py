"""RMSNorm oracle: y = x / sqrt(mean(x^2, last axis) + eps) * w.

Guard band: the sum of N squares in fp32 (gamma_N), the mean, + eps, an approximate rsqrt (2 ulp) and
two multiplies give a relative error below gamma_{N+8}(2^-23). One intermediate rounding to the output
format is allowed (HF's LlamaRMSNorm rounds x * rsqrt to the input dtype before multiplying by w): a
relative 2^-p_out. Then the output rounding, half a unit in the last place:

    band = |ref| * (gamma_{N+8}(2^-23) + 2^-p_out) + spacing_out/2 + 2^-126
"""

from __future__ import annotations

import numpy as np

from mosaic.errors import BadInput
from mosaic.oracle.formats import ACCUMULATOR, Format, gamma
from mosaic.oracle.verdict import Expectation

INPUTS = ("x", "w")
OPTIONAL = ("eps",)
OUTPUTS = ("y",)
SUMMARY = "y = x / sqrt(mean(x^2) + eps) * w over the last axis, float64 reference"
#: elements of x per chunk of rows (whole-array float64 temporaries of a 16384 x 8192 input cost tens of seconds)
ROW_CHUNK_ELEMENTS = 1 << 20
FORMULA = "|y-ref| <= |ref|*(gamma_{N+8}(2^-23) + 2^-p_out) + spacing_out/2 + 2^-126"


def reference(inputs: dict[str, np.ndarray], in_fmt: Format, out_fmt: Format) -> dict[str, Expectation]:
    x, w = inputs["x"], inputs["w"]
    if x.ndim < 1 or w.ndim != 1 or w.shape[0] != x.shape[-1]:
        raise BadInput(f"rmsnorm: w must have shape ({x.shape[-1] if x.ndim else '?'},), got {w.shape}", "inputs")
    eps = float(inputs["eps"]) if "eps" in inputs else 1e-6
    if not eps >= 0:
        raise BadInput(f"rmsnorm: eps must be >= 0, got {eps}", "inputs")
    n = x.shape[-1]
    rel = gamma(n + 8) + out_fmt.unit_roundoff
    W = w.astype(np.float64)
    flat = x.reshape(-1, n)
    ref, band = np.empty(flat.shape, np.float64), np.empty(flat.shape, np.float64)
    step = max(1, ROW_CHUNK_ELEMENTS // max(1, n))
    for lo in range(0, flat.shape[0], step):  # rows are independent: the same values, 8 MiB temporaries
        X = flat[lo:lo + step].astype(np.float64)
        r = X / np.sqrt(np.mean(X * X, axis=-1, keepdims=True) + eps) * W
        mag = np.abs(r) * (1 + rel)
        ref[lo:lo + step] = r
        band[lo:lo + step] = np.abs(r) * rel + 0.5 * out_fmt.spacing(mag) + 2.0**ACCUMULATOR.emin
    return {"y": Expectation(ref.reshape(x.shape), band.reshape(x.shape), out_fmt, FORMULA)}
