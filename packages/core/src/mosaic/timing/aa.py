"""Device evidence for the timer and the rule: the A/A test and a planted slower variant.

Each decision times the incumbent and the candidate in one block, interleaved run by run (alternating
which leads, so a clock step cannot favour either), and applies :func:`accept` with equal distances, so
only time decides.
A/A: the candidate is the incumbent itself; every acceptance is a false win (goal: rate <= 1%).
Planted: the candidate is known slower; it must be rejected and classified slower (t(c) > t(best) + noise).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import attrs

from mosaic.timing.accept import Scored, accept
from mosaic.timing.noise import Noise, measurement

MeasurePair = Callable[[bool], tuple[Sequence[float], Sequence[float]]]


@attrs.frozen
class Decisions:
    name: str
    noise_ns: float
    best_ns: tuple
    candidate_ns: tuple
    accepted: tuple

    @property
    def n(self) -> int:
        return len(self.accepted)

    @property
    def wins(self) -> int:
        return sum(self.accepted)

    @property
    def win_rate(self) -> float:
        return self.wins / self.n if self.n else float("nan")

    @property
    def slower(self) -> int:
        """Decisions where the candidate was measured slower than the incumbent by more than the noise."""
        return sum(c > b + self.noise_ns for b, c in zip(self.best_ns, self.candidate_ns, strict=True))

    @property
    def mean_ratio(self) -> float:
        return sum(c / b for b, c in zip(self.best_ns, self.candidate_ns, strict=True)) / self.n

    def to_json(self) -> dict:
        return {"name": self.name, "decisions": self.n, "accepted": self.wins, "accept_rate": self.win_rate,
                "classified_slower": self.slower, "mean_time_ratio": self.mean_ratio, "noise_ns": self.noise_ns,
                "best_ns": list(self.best_ns), "candidate_ns": list(self.candidate_ns)}


def decide_many(name: str, measure_pair: MeasurePair, noise: Noise | float, decisions: int = 100) -> Decisions:
    """``decisions`` independent accept() calls of a candidate against the incumbent, each on one block
    timed interleaved run by run. ``measure_pair(candidate_first)`` -> (incumbent runs, candidate runs);
    which kernel leads alternates between decisions."""
    value = noise.value if isinstance(noise, Noise) else float(noise)
    best, cand, acc = [], [], []
    for i in range(decisions):
        runs_b, runs_c = measure_pair(i % 2 == 1)
        tb, tc = measurement(runs_b), measurement(runs_c)
        best.append(tb)
        cand.append(tc)
        acc.append(accept(Scored(True, tc, 0.0), Scored(True, tb, 0.0), value))
    return Decisions(name, value, tuple(best), tuple(cand), tuple(acc))
