"""The pure decisions of the convergence loop: the verdict on one timed candidate and the stop rule.

Every decision is a pure function of recorded measurements, so the same answers give the same verdicts —
which is what ``mosaic run --resume`` (answers replayed from the journal) and ``mosaic run --offline``
(answers read back from the bundles) rely on. The acceptance rule itself is :func:`decide` (over
:func:`mosaic.timing.accept`, with the reference's measured noise and the physical floor of the problem).
"""

from __future__ import annotations

import attrs

from mosaic.timing import Scored, accept


@attrs.frozen
class Decision:
    accepted: bool
    reason_code: str  # faster | closer-within-noise | slower | null | below-floor
    reason: str
    closer_but_slower: bool = False


def decide(t_c: float, t_i: float, d_c: float, d_i: float, noise: float, floor_ns: float) -> Decision:
    """The verdict on one timed candidate against the incumbent (times in ns, distances D)."""
    if t_c < floor_ns:
        return Decision(False, "below-floor", f"{t_c / 1e3:.1f} us is below the physical floor "
                        f"{floor_ns / 1e3:.1f} us of the problem on this GPU: the measurement is wrong, not fast")
    ok = accept(Scored(True, t_c, d_c), Scored(True, t_i, d_i), noise)
    delta = f"{t_c / 1e3:.2f} us vs incumbent {t_i / 1e3:.2f} us (noise {noise / 1e3:.2f} us)"
    if ok:
        if t_c < t_i - noise:
            return Decision(True, "faster", f"faster by more than the noise: {delta}")
        return Decision(True, "closer-within-noise", f"within the noise and structurally closer "
                        f"(D {d_c:.3f} < {d_i:.3f}): {delta}")
    closer = d_c < d_i
    if t_c > t_i + noise:
        return Decision(False, "slower", f"slower by more than the noise: {delta}"
                        + (f"; structurally closer (D {d_c:.3f} < {d_i:.3f})" if closer else ""), closer)
    return Decision(False, "null", f"null result: within the noise and not closer (D {d_c:.3f} >= {d_i:.3f}): "
                    f"{delta}", False)


def converged(t_inc: float, t_ref: float, noise: float) -> bool:
    """The stop rule: the incumbent is within the reference's noise of it, or faster."""
    return t_inc <= t_ref + noise


def total_distance(layers) -> float:
    return float(sum(d for _, d in layers))


__all__ = ["Decision", "decide", "converged", "total_distance"]
