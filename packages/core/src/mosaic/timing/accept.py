"""The acceptance rule of the convergence loop, as one function (seeds/mosaicist.txt):

    accept(c) <=> numerics_pass(c) and ( t(c) < t(best) - noise
                                         or ( |t(c) - t(best)| <= noise and D(c) < D(best) ) )

t is measured device time, noise the run-to-run spread of the reference (``mosaic.timing.noise``), D the
fingerprint distance to the reference (a tie-breaker only). A candidate that failed the numerics gate is
never timed: its time may be None and is never read.
"""

from __future__ import annotations

import math

import attrs

from mosaic.errors import BadInput


@attrs.frozen
class Scored:
    """What the rule needs to know about one kernel: numerics gate, device time (ns), distance D."""

    numerics_pass: bool
    time: float | None = None
    distance: float = math.inf


def _t(k: Scored) -> float:
    if k.time is None or not math.isfinite(k.time) or k.time <= 0:
        raise BadInput(f"a kernel that passed numerics needs a positive measured time, got {k.time!r}")
    return float(k.time)


def _D(k: Scored) -> float:
    return float(k.distance)


def accept(c: Scored, best: Scored, noise: float) -> bool:
    """True when candidate ``c`` replaces ``best``."""
    if not (math.isfinite(noise) and noise >= 0):
        raise BadInput(f"noise must be a measured, finite, non-negative time, got {noise!r}")
    t, D = _t, _D
    return c.numerics_pass and (
        t(c) < t(best) - noise or (abs(t(c) - t(best)) <= noise and D(c) < D(best))
    )
