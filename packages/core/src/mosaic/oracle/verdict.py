"""Comparing a kernel's outputs with a float64 reference: the expectation, the per-output report and
the verdict that gates a candidate (``numerics_pass``)."""

from __future__ import annotations

import attrs
import numpy as np

from mosaic.oracle.formats import Format


@attrs.frozen(eq=False)
class Expectation:
    """What one output must hold, element by element.

    ``expected`` is the float64 reference; ``tolerance`` the guard band per element (|got - expected|
    must not exceed it); where ``exact`` is True the output must equal ``exact_value`` bit for bit
    (the products and every partial sum are representable, so any summation order gives one answer).
    """

    expected: np.ndarray
    tolerance: np.ndarray
    out_format: Format
    formula: str
    exact: np.ndarray | None = None
    exact_value: np.ndarray | None = None


@attrs.frozen
class OutputReport:
    name: str
    passed: bool
    reason: str
    elements: int
    failures: int
    nonfinite: int
    max_abs_error: float | None
    mean_abs_error: float | None
    max_error_over_band: float | None
    worst_index: tuple | None
    worst_got: float | None
    worst_expected: float | None
    worst_band: float | None
    exact_checked: int
    exact_mismatches: int
    formula: str

    def summary(self) -> str:
        """One line of error statistics; every field may be missing (no finite element, a shape mismatch)."""
        if self.max_abs_error is None:
            return "no finite element" if self.worst_index is not None or self.nonfinite else self.reason
        band = ("inf (an exact element differs)" if self.max_error_over_band is None
                else f"{self.max_error_over_band:.3g}")
        at = f" at {list(self.worst_index)}" if self.worst_index is not None else ""
        return (f"max |err| {self.max_abs_error:.3g}{at}, mean |err| {self.mean_abs_error:.3g}, "
                f"worst err/band {band}, bit-exact elements {self.exact_checked}")

    def to_json(self) -> dict:
        d = attrs.asdict(self)
        d["worst_index"] = list(self.worst_index) if self.worst_index is not None else None
        return d


@attrs.frozen
class Verdict:
    """The oracle's decision for one kernel run. ``passed`` is numerics_pass."""

    family: str
    dtype: str
    out_dtype: str
    passed: bool
    reason: str
    outputs: tuple = ()

    def to_json(self) -> dict:
        return {"family": self.family, "dtype": self.dtype, "out_dtype": self.out_dtype, "passed": self.passed,
                "reason": self.reason, "outputs": [o.to_json() for o in self.outputs]}


def numerics_pass(verdict: Verdict | None) -> bool:
    """A candidate passes the numerics gate only with a verdict that passed (no verdict: not checked)."""
    return verdict is not None and verdict.passed


def _fmt_index(idx: tuple) -> str:
    return "(" + ", ".join(str(i) for i in idx) + ")"


#: elements per chunk of :func:`compare` (8 MiB per float64 temporary: a 16384 x 8192 output in whole-array
#: temporaries spent ~12 s of a 14 s gate in allocation and memory traffic)
CHUNK = 1 << 20


def _flat(a: np.ndarray | None) -> np.ndarray | None:
    return None if a is None else np.ravel(np.asarray(a))


def compare(name: str, got: np.ndarray, exp: Expectation, chunk: int = CHUNK) -> OutputReport:
    """Check one output against its expectation; every element is checked, NaN and inf never pass.

    The elements are taken ``chunk`` at a time in memory order (the same tests element by element, with the
    first non-finite element, the first exact mismatch and the first worst ratio kept across chunks)."""
    got = np.asarray(got)
    shape = exp.expected.shape
    if got.shape != shape:
        return OutputReport(name, False, f"{name}: shape {got.shape} != expected {shape}", int(np.prod(shape)),
                            int(np.prod(shape)), 0, None, None, None, None, None, None, None, 0, 0, exp.formula)
    gf, ef, tf = _flat(got), _flat(exp.expected), _flat(exp.tolerance)
    xf, vf = _flat(exp.exact), _flat(exp.exact_value)
    size = int(gf.size)
    exact_checked = exact_mismatches = nonfinite = failures = finite_count = 0
    max_abs = max_ratio = best = None
    sum_abs = 0.0
    worst_flat = first_nonfinite = first_mismatch = None
    for lo in range(0, size, max(1, int(chunk))):
        sl = slice(lo, min(size, lo + max(1, int(chunk))))
        g = gf[sl].astype(np.float64)
        finite = np.isfinite(g)
        err = np.abs(g - ef[sl])
        err = np.where(finite, err, np.inf)
        tol = tf[sl]
        bad = err > tol
        mism = None
        if xf is not None:
            ex = xf[sl]
            mism = ex & finite & (g != vf[sl])
            exact_checked += int(ex.sum())
            m = int(mism.sum())
            if m and first_mismatch is None:
                first_mismatch = lo + int(np.argmax(mism))
            exact_mismatches += m
            bad |= mism
        nf = int(g.size - finite.sum())
        if nf and first_nonfinite is None:
            first_nonfinite = lo + int(np.argmax(~finite))
        nonfinite += nf
        failures += int(bad.sum())
        fin_err = err[finite]
        if fin_err.size:
            top = float(fin_err.max())
            max_abs = top if max_abs is None else max(max_abs, top)
            sum_abs += float(fin_err.sum())
            finite_count += int(fin_err.size)
        with np.errstate(divide="ignore", invalid="ignore"):
            ratio = np.where(tol > 0, err / tol, np.where(err > 0, np.inf, 0.0))
        if mism is not None and mism.any():
            ratio = np.where(mism, np.maximum(ratio, np.inf), ratio)
        if ratio.size:
            at = int(np.argmax(ratio))
            if best is None or ratio[at] > best:
                best, worst_flat = ratio[at], lo + at
            fin_ratio = ratio[finite & ~np.isinf(ratio)]
            if fin_ratio.size:
                top = float(fin_ratio.max())
                max_ratio = top if max_ratio is None else max(max_ratio, top)
    mean_abs = sum_abs / finite_count if finite_count else None

    def index(flat: int) -> tuple:
        return tuple(int(i) for i in np.unravel_index(flat, shape))

    def value(arr: np.ndarray, idx: tuple) -> float:
        return float(np.float64(arr[idx]))

    worst = index(worst_flat) if worst_flat is not None else None
    if nonfinite:
        first = index(first_nonfinite)
        kind = "NaN" if np.isnan(value(got, first)) else "inf"
        reason = (f"{name}: {nonfinite} non-finite element(s); first {kind} at {_fmt_index(first)} "
                  f"(never written, or computed {kind})")
    elif exact_mismatches:
        first = index(first_mismatch)
        reason = (f"{name}: {exact_mismatches} of {exact_checked} exactly representable element(s) differ; "
                  f"first at {_fmt_index(first)}: got {value(got, first)!r}, exact {value(exp.exact_value, first)!r}")
    elif failures:
        w = worst
        t = value(exp.tolerance, w)
        e = abs(value(got, w) - value(exp.expected, w))
        with np.errstate(divide="ignore", invalid="ignore"):
            r = e / t if t > 0 else (np.inf if e > 0 else 0.0)
        reason = (f"{name}: {failures} element(s) outside the guard band; worst at {_fmt_index(w)}: got "
                  f"{value(got, w)!r}, expected {value(exp.expected, w)!r} ± {t:.3g} ({r:.3g}x the band)")
    else:
        reason = ""
    wi = worst
    return OutputReport(
        name=name, passed=failures == 0, reason=reason, elements=size, failures=failures,
        nonfinite=nonfinite, max_abs_error=max_abs, mean_abs_error=mean_abs, max_error_over_band=max_ratio,
        worst_index=wi, worst_got=value(got, wi) if wi is not None else None,
        worst_expected=value(exp.expected, wi) if wi is not None else None,
        worst_band=value(exp.tolerance, wi) if wi is not None else None,
        exact_checked=exact_checked, exact_mismatches=exact_mismatches, formula=exp.formula)
