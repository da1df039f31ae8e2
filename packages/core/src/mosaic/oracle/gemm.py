"""GEMM oracle: C = scale * (A @ B) + bias, A (M x K) and B (K x N) row-major, fp32 accumulation.

Guard band per element (documented in docs/oracle-and-timing.md):

    S    = |scale| * (|A| @ |B|) + |bias|                  (the magnitude the accumulator carries)
    E    = gamma_n(2^-23) * S + n * 2^-149,  n = K (+1 with scale, +1 with bias, +1 for fp32 inputs)
    band = E + 1/2 * spacing_out(|ref| + E)

``gamma_n(u) = n u / (1 - n u)`` bounds n rounded fp32 operations in ANY order (Higham, Accuracy and
Stability, thm 3.1 / 4.2 hold for every summation tree); u = 2^-23 (twice round-to-nearest) also covers
truncating accumulators. bf16 x bf16 and f16 x f16 products are exact in fp32 (8+8 and 11+11
significand bits <= 24). The final conversion to the output format rounds to nearest: half a unit in
the last place at the value. Bit-exact: where every product is a multiple of q = 2^(lsb row of A + lsb
column of B) and S <= 2^24 q, every partial sum in any order is exactly representable in fp32, so the
accumulator holds the exact value and the output must equal round_to_nearest_out(ref) bit for bit.
"""

from __future__ import annotations

import numpy as np

from mosaic.errors import BadInput
from mosaic.oracle.formats import ACCUMULATOR, Format, gamma, lsb_exponent
from mosaic.oracle.verdict import Expectation

INPUTS = ("a", "b")
OPTIONAL = ("scale", "bias")
OUTPUTS = ("c",)
SUMMARY = "C = scale * (A @ B) + bias, row-major, float64 reference, fp32-accumulation guard band, bit-exact when representable"
FORMULA = "|c-ref| <= gamma_n(2^-23)*(|s|*(|A|@|B|)+|bias|) + n*2^-149 + spacing_out/2; exact where partial sums fit fp32"


def reference(inputs: dict[str, np.ndarray], in_fmt: Format, out_fmt: Format) -> dict[str, Expectation]:
    a, b = inputs["a"], inputs["b"]
    if a.ndim != 2 or b.ndim != 2:
        raise BadInput(f"gemm needs 2-D a (M x K) and b (K x N); got a{a.shape}, b{b.shape}", "inputs")
    if a.shape[1] != b.shape[0]:
        raise BadInput(f"gemm: a is {a.shape[0]}x{a.shape[1]} but b is {b.shape[0]}x{b.shape[1]} (K must match)",
                       "inputs")
    k = a.shape[1]
    A, B = a.astype(np.float64), b.astype(np.float64)
    ref = A @ B
    mag = np.abs(A) @ np.abs(B)
    n = k + (1 if in_fmt.precision * 2 > ACCUMULATOR.precision else 0)  # inexact products round once
    scale = inputs.get("scale")
    bias = inputs.get("bias")
    s = 1.0
    if scale is not None:
        if np.ndim(scale) != 0:
            raise BadInput(f"gemm: scale must be a scalar, got shape {np.shape(scale)}", "inputs")
        s = float(scale)
        ref, mag, n = ref * s, mag * abs(s), n + 1
    if bias is not None:
        if np.ndim(bias) != 1 or bias.shape[0] != b.shape[1]:
            raise BadInput(f"gemm: bias must have shape ({b.shape[1]},), got {np.shape(bias)}", "inputs")
        bb = bias.astype(np.float64)
        ref, mag, n = ref + bb, mag + np.abs(bb), n + 1
    if not np.all(np.isfinite(ref)) or np.any(np.abs(ref) > out_fmt.max_finite):
        raise BadInput(f"gemm: the reference overflows {out_fmt.name}; these inputs cannot be checked", "inputs")
    err = gamma(n) * mag + n * ACCUMULATOR.tiny
    band = err + 0.5 * out_fmt.spacing(np.abs(ref) + err)
    exact = exact_value = None
    s_exp = np.log2(abs(s)) if s != 0 else 0.0
    if bias is None and s != 0 and float(s_exp).is_integer():
        qa = lsb_exponent(a).min(axis=1, initial=np.inf)  # per row of A
        qb = lsb_exponent(b).min(axis=0, initial=np.inf)  # per column of B
        q = qa[:, None] + qb[None, :] + s_exp
        with np.errstate(invalid="ignore"):
            exact = (mag == 0) | ((q >= ACCUMULATOR.emin - ACCUMULATOR.precision + 1)
                                 & (mag <= np.ldexp(1.0, ACCUMULATOR.precision) * np.exp2(np.minimum(q, 1000))))
        exact_value = out_fmt.round(ref)
    return {"c": Expectation(ref, band, out_fmt, FORMULA, exact, exact_value)}
