"""Softmax oracle: y = exp(x - max) / sum(exp(x - max)) over the last axis.

Guard band, relative per element: exp(z) as ex2(z * log2 e) costs (1 + |z|) * 2^-21 (2 ulp of ex2.approx
plus the rounding of z * log2 e, which scales with |z|); the denominator carries the worst of those plus
the fp32 sum (an online softmax rescales as it goes: gamma_{2N}); one division (2^-22, approximate).
An absolute 2^-126 allows flush-to-zero of tiny probabilities. Then the output rounding:

    rel_i = (1+|z_i|) 2^-21 + max_j (1+|z_j|) 2^-21 + gamma_{2N}(2^-23) + 2^-22
    band  = |ref| * rel + spacing_out/2 + 2^-126
"""

from __future__ import annotations

import numpy as np

from mosaic.errors import BadInput
from mosaic.oracle.formats import ACCUMULATOR, Format, gamma
from mosaic.oracle.verdict import Expectation

INPUTS = ("x",)
OPTIONAL = ()
OUTPUTS = ("y",)
SUMMARY = "y = softmax(x) over the last axis, float64 reference"
FORMULA = "|y-ref| <= |ref|*((1+|z|)2^-21 + max(1+|z|)2^-21 + gamma_2N(2^-23) + 2^-22) + spacing_out/2 + 2^-126"


def reference(inputs: dict[str, np.ndarray], in_fmt: Format, out_fmt: Format) -> dict[str, Expectation]:
    x = inputs["x"]
    if x.ndim < 1 or x.shape[-1] == 0:
        raise BadInput(f"softmax: x must have a non-empty last axis, got shape {x.shape}", "inputs")
    X = x.astype(np.float64)
    z = X - X.max(axis=-1, keepdims=True)
    e = np.exp(z)
    ref = e / e.sum(axis=-1, keepdims=True)
    n = x.shape[-1]
    eexp = (1 + np.abs(z)) * 2.0**-21
    rel = eexp + eexp.max(axis=-1, keepdims=True) + gamma(2 * n) + 2.0**-22
    band = np.abs(ref) * rel + 0.5 * out_fmt.spacing(np.abs(ref) * (1 + rel)) + 2.0**ACCUMULATOR.emin
    return {"y": Expectation(ref, band, out_fmt, FORMULA)}
