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


def compare(name: str, got: np.ndarray, exp: Expectation) -> OutputReport:
    """Check one output against its expectation; every element is checked, NaN and inf never pass."""
    got = np.asarray(got)
    shape = exp.expected.shape
    if got.shape != shape:
        return OutputReport(name, False, f"{name}: shape {got.shape} != expected {shape}", int(np.prod(shape)),
                            int(np.prod(shape)), 0, None, None, None, None, None, None, None, 0, 0, exp.formula)
    g = got.astype(np.float64)
    finite = np.isfinite(g)
    err = np.abs(g - exp.expected)
    err = np.where(finite, err, np.inf)
    bad = err > exp.tolerance
    exact_checked = exact_mismatches = 0
    if exp.exact is not None:
        mism = exp.exact & finite & (g != exp.exact_value)
        exact_checked = int(exp.exact.sum())
        exact_mismatches = int(mism.sum())
        bad |= mism
    nonfinite = int((~finite).sum())
    failures = int(bad.sum())
    fin_err = err[finite]
    max_abs = float(fin_err.max()) if fin_err.size else None
    mean_abs = float(fin_err.mean()) if fin_err.size else None
    with np.errstate(divide="ignore", invalid="ignore"):
        ratio = np.where(exp.tolerance > 0, err / exp.tolerance, np.where(err > 0, np.inf, 0.0))
    if exact_mismatches:
        ratio = np.where(mism, np.maximum(ratio, np.inf), ratio)
    flat = int(np.argmax(ratio)) if ratio.size else 0
    worst = tuple(int(i) for i in np.unravel_index(flat, shape)) if ratio.size else None
    fin_ratio = ratio[finite & ~np.isinf(ratio)]
    max_ratio = float(fin_ratio.max()) if fin_ratio.size else None
    if nonfinite:
        first = tuple(int(i) for i in np.argwhere(~finite)[0])
        kind = "NaN" if np.isnan(g[first]) else "inf"
        reason = (f"{name}: {nonfinite} non-finite element(s); first {kind} at {_fmt_index(first)} "
                  f"(never written, or computed {kind})")
    elif exact_mismatches:
        first = tuple(int(i) for i in np.argwhere(mism)[0])
        reason = (f"{name}: {exact_mismatches} of {exact_checked} exactly representable element(s) differ; "
                  f"first at {_fmt_index(first)}: got {float(g[first])!r}, exact {float(exp.exact_value[first])!r}")
    elif failures:
        w = worst
        reason = (f"{name}: {failures} element(s) outside the guard band; worst at {_fmt_index(w)}: got "
                  f"{float(g[w])!r}, expected {float(exp.expected[w])!r} ± {exp.tolerance[w]:.3g} ({ratio[w]:.3g}x the band)")
    else:
        reason = ""
    wi = worst if worst is not None else None
    return OutputReport(
        name=name, passed=failures == 0, reason=reason, elements=int(g.size), failures=failures,
        nonfinite=nonfinite, max_abs_error=max_abs, mean_abs_error=mean_abs, max_error_over_band=max_ratio,
        worst_index=wi, worst_got=float(g[wi]) if wi is not None else None,
        worst_expected=float(exp.expected[wi]) if wi is not None else None,
        worst_band=float(exp.tolerance[wi]) if wi is not None else None,
        exact_checked=exact_checked, exact_mismatches=exact_mismatches, formula=exp.formula)
