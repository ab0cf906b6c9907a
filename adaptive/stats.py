"""How far a prediction holds: each recorded run replayed alone (`per_run`) and bootstrap intervals of
the predicted speed-ups over resamples of the trace's requests (`speedup_intervals`). Torch-free.
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from specctl.adaptive.cost import CostModel
from specctl.adaptive.replay import Prediction, Runs, fixed_config, replay, resample_requests
from specctl.schemas.adaptive import (
    AdaptiveConfig,
)

# Request resamples behind the predicted speed-ups' intervals (`speedup_intervals`), fixed seed.
BOOTSTRAP = 100
BOOTSTRAP_SEED = 13


def ratio(p: Prediction, base: Prediction) -> float:
    return p.tokens_per_s / base.tokens_per_s if base.tokens_per_s else math.inf



@dataclass(frozen=True)
class RunBreakdown:
    """One recorded run (one engine of the trace) replayed alone under the recommendation and under each
    fixed step: one config serves every run, so on a run of its own kind of traffic (a workload at one
    concurrency) a fixed step can beat it, and this says by how much. The figures include the serving
    overhead when the whole prediction does."""

    run: str | None
    verifies: int
    max_batch_size: int
    recommended: Prediction
    best_fixed_steps: int
    best_fixed: Prediction

    @property
    def vs_best_fixed(self) -> float:
        return ratio(self.recommended, self.best_fixed)

    def to_json(self) -> dict[str, Any]:
        return {"run": self.run, "verifies": self.verifies, "max_batch_size": self.max_batch_size,
                "recommended_tokens_per_s": self.recommended.tokens_per_s,
                "best_fixed_steps": self.best_fixed_steps, "best_fixed_tokens_per_s": self.best_fixed.tokens_per_s,
                "vs_best_fixed": self.vs_best_fixed}


def per_run(cfg: AdaptiveConfig, initial_steps: int, runs: Runs, cost: CostModel, graphs: Sequence[int],
            steps: Sequence[int], adjust: Callable[[Prediction], Prediction] = lambda p: p) -> tuple[RunBreakdown, ...]:
    """`RunBreakdown` of every run of `runs` (`steps`: the fixed steps to compare, `adjust`: what the whole
    prediction adds, the serving overhead)."""
    out = []
    for run in runs.runs:
        one = Runs((run,))
        rec = adjust(replay(cfg, one, cost, initial_steps=initial_steps, graph_batch_sizes=graphs))
        fixed = {k: adjust(replay(fixed_config(k), one, cost, initial_steps=k)) for k in steps}
        best = max(fixed, key=lambda k: (fixed[k].tokens_per_s, -k))
        recs = run[0]
        out.append(RunBreakdown(recs[0].run, len(recs), max(r.batch_size for r in recs), rec, best, fixed[best]))
    return tuple(out)


def speedup_intervals(cfg: AdaptiveConfig, initial_steps: int, best_k: int, runs: Runs, cost: CostModel,
                      graphs: Sequence[int], adjust: Callable[[Prediction], Prediction] = lambda p: p,
                      resamples: int = BOOTSTRAP) -> dict[str, tuple[float, float]] | None:
    """95% percentile intervals of the recommendation's predicted speed-up over the best fixed step and over
    no speculation, over `resamples` replicates of the trace's requests (`resample_requests`): how much the
    predictions move with which requests the trace happened to hold. A trace of a few requests of sampled
    text cannot tell configs within a few percent apart; the interval says so. (The recommendation was
    chosen on the whole trace, so its own interval leans optimistic.) None without positional facts."""
    rng = random.Random(BOOTSTRAP_SEED)
    fixed, none = fixed_config(best_k), fixed_config(0)
    vs_fixed: list[float] = []
    vs_none: list[float] = []
    for _ in range(resamples):
        rep = resample_requests(runs, rng)
        if rep is None:
            return None
        rec = adjust(replay(cfg, rep, cost, initial_steps=initial_steps, graph_batch_sizes=graphs))
        vs_fixed.append(ratio(rec, adjust(replay(fixed, rep, cost, initial_steps=best_k))))
        vs_none.append(ratio(rec, adjust(replay(none, rep, cost, initial_steps=0))))

    def band(xs: list[float]) -> tuple[float, float]:
        xs = sorted(xs)
        return xs[int(0.025 * (len(xs) - 1))], xs[math.ceil(0.975 * (len(xs) - 1))]

    return {"vs_best_fixed": band(vs_fixed), "vs_none": band(vs_none)}

