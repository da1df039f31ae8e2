"""Value distributions shared by the families' input generators.

Every generator draws from ``numpy.random.default_rng(seed)`` in a fixed order and returns float32 arrays
whose every element is exactly a number of the kernel's format (the oracle refuses anything else), so
the same seed gives the same bits on every machine. What each distribution is for:

- ``normal``: standard normal values rounded to the format (a realistic spread of magnitudes).
- ``int``: integers in [-4, 4], exact in every format; products and sums of them stay exact in fp32 for
  reductions below 2^20, so the oracle can demand bit-exact results where the family allows it.
- ``large``: magnitudes as large as the family's computation can carry in fp32 and the output format
  without overflow (each family computes its scale: ``large_exponent``), or, for the softmax-like
  families, scores far outside exp's fp32 range (|x| >= 2^8 > 88.7), so a kernel that does not subtract
  the row maximum overflows.
- ``equal-rows``: every row repeats one value (softmax: exactly uniform output; attention: every key
  equal, so each query averages the values).
- ``denormal``: subnormal numbers of the format, 0 < |x| < 2^emin: a kernel that flushes them to zero
  where the result depends on them fails the oracle.
"""

from __future__ import annotations

import math

import numpy as np

from mosaic.oracle.formats import Format

#: distribution name -> what it draws (``mosaic families`` shows these)
DISTRIBUTIONS = {
    "normal": "standard normal values rounded to the format",
    "int": "integers in [-4, 4]: exact in every format (bit-exact checks where sums fit fp32)",
    "large": "the largest magnitudes the computation holds in fp32 and the output format (per family)",
    "equal-rows": "every row one repeated value (softmax and attention: exactly uniform weights)",
    "denormal": "subnormal numbers of the format (0 < |x| < 2^emin): catches flush-to-zero",
}
#: a score offset beyond exp's fp32 range (exp(88.8) overflows): the ``large`` softmax and attention inputs
SCORE_OFFSET = 2.0**8


def normal(rng: np.random.Generator, shape: tuple[int, ...], f: Format, scale: float = 1.0) -> np.ndarray:
    """Standard normal values times ``scale``, rounded to ``f``."""
    return f.round(rng.standard_normal(shape, dtype=np.float32).astype(np.float64) * scale).astype(np.float32)


def small_ints(rng: np.random.Generator, shape: tuple[int, ...]) -> np.ndarray:
    """Integers in [-4, 4] (exact in bf16, f16 and f32)."""
    return rng.integers(-4, 5, size=shape).astype(np.float32)


def magnitude(rng: np.random.Generator, shape: tuple[int, ...], f: Format, exponent: int) -> np.ndarray:
    """Values of magnitude in [2^e, 2^(e+1)] with random signs and significands, rounded to ``f``."""
    e = min(exponent, f.emax - 1)
    sig = 1.0 + rng.random(shape)
    sign = np.where(rng.random(shape) < 0.5, -1.0, 1.0)
    return f.round(sign * np.ldexp(sig, e)).astype(np.float32)


def subnormal(rng: np.random.Generator, shape: tuple[int, ...], f: Format) -> np.ndarray:
    """Subnormal numbers of ``f``: ``m * 2^(emin - p + 1)`` for m in [1, 2^(p-1) - 1], random signs
    (float32 holds every one of bf16, f16 and f32 exactly)."""
    m = rng.integers(1, 2 ** (f.precision - 1), size=shape).astype(np.float64)
    sign = np.where(rng.random(shape) < 0.5, -1.0, 1.0)
    return (sign * m * f.tiny).astype(np.float32)


def equal_rows(rng: np.random.Generator, shape: tuple[int, ...], f: Format) -> np.ndarray:
    """One normal value per row (the last axis), repeated along the row."""
    row = normal(rng, (*shape[:-1], 1), f)
    return np.ascontiguousarray(np.broadcast_to(row, shape))


def large_exponent(f_in: Format, *bounds: tuple[int, float, int]) -> int:
    """The exponent e of the ``large`` inputs: the largest e such that values up to 2^(e+1), raised to
    ``power`` and grown by ``2^log2_growth`` (a reduction's length), stay below 2^(emax - 1) -- a quarter
    of the largest finite number -- for every bound ``(emax, log2_growth, power)`` (the fp32 accumulator,
    the output format), and inside the input format. May be negative: then nothing larger than 1 fits."""
    e = f_in.emax - 1
    for emax, growth, power in bounds:
        e = min(e, math.floor((emax - 1 - math.ceil(growth)) / power) - 1)
    return e


def is_subnormal(x: np.ndarray, f: Format) -> np.ndarray:
    """True where a value is a non-zero subnormal number of ``f``."""
    ax = np.abs(np.asarray(x, dtype=np.float64))
    return (ax > 0) & (ax < 2.0**f.emin) & f.representable(x)
