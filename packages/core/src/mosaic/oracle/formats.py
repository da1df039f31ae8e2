"""Number formats the oracle reasons about: significand bits, exponent range, rounding, spacing.

Everything is computed in float64 from first principles (``frexp``/``ldexp``), so rounding a float64
value to bf16 never goes through float32 first (which could double-round).
"""

from __future__ import annotations

import attrs
import numpy as np

from mosaic.errors import BadInput

#: elements per chunk of :meth:`Format.round` on a large array (8 MiB per float64 temporary)
ROUND_CHUNK = 1 << 20


@attrs.frozen
class Format:
    name: str
    precision: int  # significand bits including the implicit one (bf16 8, f16 11, f32 24)
    emin: int  # exponent of the smallest normal number
    emax: int  # exponent of the largest finite number

    @property
    def unit_roundoff(self) -> float:
        """u = 2^-p: the largest relative error of round-to-nearest."""
        return 2.0 ** -self.precision

    @property
    def max_finite(self) -> float:
        return (2.0 - 2.0 ** (1 - self.precision)) * 2.0**self.emax

    @property
    def tiny(self) -> float:
        """Spacing of the subnormals (the smallest positive value)."""
        return 2.0 ** (self.emin - self.precision + 1)

    def spacing(self, x: np.ndarray) -> np.ndarray:
        """The distance between adjacent representable numbers at |x| (one unit in the last place)."""
        ax = np.abs(np.asarray(x, dtype=np.float64))
        _, e = np.frexp(ax)  # ax = f * 2^e, f in [0.5, 1): exponent of ax is e - 1
        exp = np.maximum(e.astype(np.int64) - 1, self.emin)
        return np.ldexp(1.0, (exp - self.precision + 1).astype(np.int32))

    def round(self, x: np.ndarray) -> np.ndarray:
        """Round float64 values to this format, to nearest with ties to even; overflow gives inf. Element-wise, so
        a large array is rounded ``ROUND_CHUNK`` elements at a time into one float64 result (the same values;
        whole-array temporaries of a 10^8-element input cost seconds)."""
        x = np.asarray(x, dtype=np.float64)
        if x.size > ROUND_CHUNK:
            flat = np.ravel(x)
            out = np.empty(flat.shape, np.float64)
            for lo in range(0, flat.size, ROUND_CHUNK):
                out[lo:lo + ROUND_CHUNK] = self._round(flat[lo:lo + ROUND_CHUNK])
            return out.reshape(x.shape)
        return self._round(x)

    def _round(self, x: np.ndarray) -> np.ndarray:
        q = self.spacing(x)
        with np.errstate(over="ignore", invalid="ignore"):
            r = np.round(x / q) * q  # x / q is exact (power of two); np.round ties to even
            r = np.where(np.abs(r) > self.max_finite, np.copysign(np.inf, x), r)
        return np.where(np.isfinite(x), r, x)

    def representable(self, x: np.ndarray) -> np.ndarray:
        """True where a value is exactly a number of this format (NaN and inf count as representable)."""
        x = np.asarray(x, dtype=np.float64)
        with np.errstate(invalid="ignore"):
            return ~np.isfinite(x) | (self.round(x) == x)


FORMATS = {
    "bf16": Format("bf16", 8, -126, 127),
    "f16": Format("f16", 11, -14, 15),
    "f32": Format("f32", 24, -126, 127),
}
ACCUMULATOR = FORMATS["f32"]
#: relative error allowed per fp32 accumulation step: 2^-23, twice the round-to-nearest unit roundoff,
#: so accumulators that truncate (as Hopper tensor cores are reported to when aligning addends) pass.
U_ACC = 2.0**-23


def fmt(name: str) -> Format:
    try:
        return FORMATS[name]
    except KeyError:
        raise BadInput(f"dtype '{name}' has no oracle format; known: {', '.join(FORMATS)}", "--dtype") from None


def gamma(n: int | np.ndarray, u: float = U_ACC) -> np.ndarray:
    """Higham's gamma_n = n u / (1 - n u): the relative error bound of n rounded operations."""
    nu = np.asarray(n, dtype=np.float64) * u
    if np.any(nu >= 1):
        raise BadInput(f"reduction of length {int(np.max(n))} is too long for a bounded fp32 error")
    return nu / (1 - nu)


def lsb_exponent(x: np.ndarray) -> np.ndarray:
    """Exponent of the lowest set bit of each float32 value (x = odd * 2^lsb); +inf for zeros."""
    x = np.asarray(x, dtype=np.float32)
    f, e = np.frexp(np.abs(x).astype(np.float64))
    mant = np.ldexp(f, 24).astype(np.int64)  # exact: a float32 significand has 24 bits
    low = mant & -mant
    with np.errstate(divide="ignore"):
        tz = np.where(mant > 0, np.log2(np.maximum(low, 1)).astype(np.int64), 0)
    out = (e.astype(np.int64) - 24 + tz).astype(np.float64)
    return np.where(x == 0, np.inf, out)
