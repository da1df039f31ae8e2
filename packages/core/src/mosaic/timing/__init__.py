"""Device timing: CUPTI activity records (CUDA events as a declared fallback), the reference's measured
noise, and the acceptance rule. See docs/oracle-and-timing.md."""

from mosaic.timing.accept import Scored, accept
from mosaic.timing.noise import Noise, Summary, measure_noise, measurement, summarize

__all__ = ["accept", "Scored", "Noise", "Summary", "measure_noise", "measurement", "summarize"]
