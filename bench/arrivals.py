"""Arrival schedules for open-loop load: absolute send offsets (seconds from the start of the run).

Gaps are Poisson (exponential, `burstiness` 1) or gamma with shape `burstiness` (< 1 burstier, > 1
more regular; `inf` gives constant gaps), all with mean `1/rate`, drawn from a seeded RNG.

The schedule is *conditioned on its span*: the gaps are rescaled so that N arrivals span exactly
(N-1)/rate seconds. For a Poisson or gamma renewal process this is the exact conditional
distribution given the sum of the gaps (normalised i.i.d. gamma gaps are Dirichlet distributed,
which is what conditioning on the sum yields), so the arrival shape is unchanged while the offered
rate equals the requested one instead of wandering by +-1/sqrt(N) with the seed. Any shortfall of
the achieved rate is then the client's own pacing error, which the report shows.
"""

from __future__ import annotations

import math
import random

from specctl.errors import UsageError


def arrival_offsets(n: int, rate: float, *, burstiness: float = 1.0, seed: int = 0) -> list[float]:
    """`n` non-decreasing offsets starting at 0.0; all 0.0 for an infinite rate."""
    if n < 1:
        return []
    if not math.isfinite(rate):
        return [0.0] * n
    if not rate > 0:
        raise UsageError(f"request rate must be > 0, got {rate}")
    if not burstiness > 0:
        raise UsageError(f"--burstiness must be > 0, got {burstiness}")
    if n == 1:
        return [0.0]
    if math.isinf(burstiness):
        gaps = [1.0] * (n - 1)
    else:
        rng = random.Random(seed)
        # Gamma(shape=k, scale=1) gaps; the scale is irrelevant after normalisation.
        gaps = [rng.gammavariate(burstiness, 1.0) for _ in range(n - 1)]
    span = (n - 1) / rate
    total = sum(gaps)
    out = [0.0]
    acc = 0.0
    for gap in gaps:
        acc += gap
        out.append(span * acc / total)
    return out


def count_for_duration(duration_s: float, rate: float) -> int:
    """How many arrivals a `duration_s` run at `rate` gets: one at 0 plus one per 1/rate after it."""
    if not duration_s > 0:
        raise UsageError(f"--duration must be > 0, got {duration_s}")
    return max(1, int(math.floor(duration_s * rate)) + 1)
