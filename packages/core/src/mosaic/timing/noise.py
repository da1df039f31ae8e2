"""Run-to-run statistics of device times and the noise of the reference.

A *measurement* of a kernel is one block of R timed runs (after warm-up, each run preceded by an L2
flush); its time is the median of the R per-run device times (robust to the odd preempted run).

GPU clocks drift under sustained load: on the lent H200 the block medians of one CUTLASS GEMM measured
one after another walked from 171 us to 185 us within a few seconds (power/thermal clock steps), so any
statistic over blocks timed one after another measures the drift, not the kernel. Kernels are therefore
compared *interleaved run by run* (A B A B ... inside one block, each run after its own L2 flush) and the
noise is measured the same way, the reference against itself:

    blocks come in pairs (2i, 2i+1) = (A_i, A'_i), both the reference, timed alternately run by run;
    d_i   = median(A_i) - median(A'_i)                               (P >= 5 pairs)
    noise = t(0.995, P-1) * sd(d_1 .. d_P)

``noise`` is a two-sided 99% prediction bound for the difference of the next paired comparison of two
identical kernels, so one A/A decision ``t(c) < t(best) - noise`` is a false win with probability ~0.5%
(assuming roughly normal d_i; the A/A test measures the rate on the device instead of trusting it).
A clock step inside a block shifts A and A' alike and cancels in d_i.
"""

from __future__ import annotations

from collections.abc import Sequence

import attrs
import numpy as np

from mosaic.errors import BadInput

MIN_BLOCKS = 5
MIN_RUNS = 3
CONFIDENCE = 0.995
_Z = 2.5758293035489004  # the standard normal quantile at CONFIDENCE


def t_quantile(df: int) -> float:
    """Student's t quantile at CONFIDENCE (0.995) by the Cornish-Fisher expansion (Abramowitz & Stegun
    26.7.5); within 0.3% of the exact value for df >= 4 (4.604 at df 4, 2.861 at df 19)."""
    if df < 1:
        raise BadInput(f"t quantile needs df >= 1, got {df}")
    z, v = _Z, float(df)
    return (z + (z**3 + z) / (4 * v) + (5 * z**5 + 16 * z**3 + 3 * z) / (96 * v**2)
            + (3 * z**7 + 19 * z**5 + 17 * z**3 - 15 * z) / (384 * v**3)
            + (79 * z**9 + 776 * z**7 + 1482 * z**5 - 1920 * z**3 - 945 * z) / (92160 * v**4))


def _times(samples: Sequence[float], what: str) -> np.ndarray:
    arr = np.asarray(samples, dtype=np.float64)
    if arr.ndim != 1 or arr.size == 0:
        raise BadInput(f"{what}: need a non-empty list of device times")
    if not np.all(np.isfinite(arr)) or np.any(arr <= 0):
        raise BadInput(f"{what}: device times must be finite and positive")
    return arr


@attrs.frozen
class Summary:
    """Order statistics of one block of per-run device times (nanoseconds)."""

    runs: int
    median: float
    mean: float
    min: float
    max: float
    p10: float
    p90: float
    mad: float  # median absolute deviation from the median

    def to_json(self) -> dict:
        return attrs.asdict(self)


def summarize(samples: Sequence[float]) -> Summary:
    t = _times(samples, "summarize")
    med = float(np.median(t))
    return Summary(runs=int(t.size), median=med, mean=float(t.mean()), min=float(t.min()), max=float(t.max()),
                   p10=float(np.percentile(t, 10)), p90=float(np.percentile(t, 90)),
                   mad=float(np.median(np.abs(t - med))))


def measurement(samples: Sequence[float]) -> float:
    """The time of one measurement (block): the median of its runs."""
    return float(np.median(_times(samples, "measurement")))


@attrs.frozen
class Noise:
    """The reference's measured run-to-run noise (nanoseconds) and how it was obtained."""

    value: float
    blocks: int
    runs_per_block: int
    block_medians: tuple
    differences: tuple = ()
    statistic: str = "t(0.995, P-1) * sd(d), d = median(A) - median(A') of P interleaved self-pairs"

    @property
    def reference_time(self) -> float:
        return float(np.median(self.block_medians))

    @property
    def relative(self) -> float:
        return self.value / self.reference_time

    def to_json(self) -> dict:
        return {"value_ns": self.value, "relative": self.relative, "statistic": self.statistic,
                "pairs": len(self.differences), "differences_ns": list(self.differences),
                "sequential_range_ns": max(self.block_medians) - min(self.block_medians),
                "blocks": self.blocks, "runs_per_block": self.runs_per_block,
                "block_medians_ns": list(self.block_medians), "reference_time_ns": self.reference_time}


def measure_noise(blocks: Sequence[Sequence[float]]) -> Noise:
    """Noise from P >= 5 interleaved self-pairs of the reference: blocks (2i, 2i+1), each >= 3 runs.

    Pass blocks as the capture records them: A_0, A'_0, A_1, A'_1, ... (see the module docstring).
    """
    if len(blocks) < 2 * MIN_BLOCKS or len(blocks) % 2:
        raise BadInput(f"noise needs an even number of at least {2 * MIN_BLOCKS} blocks (>= {MIN_BLOCKS} "
                       f"interleaved pairs of the reference against itself), got {len(blocks)}")
    arrays = [_times(b, f"noise block {i}") for i, b in enumerate(blocks)]
    short = [i for i, b in enumerate(arrays) if b.size < MIN_RUNS]
    if short:
        raise BadInput(f"noise blocks {short} have fewer than {MIN_RUNS} runs")
    medians = tuple(float(np.median(b)) for b in arrays)
    diffs = tuple(medians[2 * i] - medians[2 * i + 1] for i in range(len(medians) // 2))
    sd = float(np.std(diffs, ddof=1))
    return Noise(value=t_quantile(len(diffs) - 1) * sd, blocks=len(arrays),
                 runs_per_block=int(min(b.size for b in arrays)), block_medians=medians, differences=diffs)
