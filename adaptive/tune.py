"""Adaptive-config tuning: replay a verify trace counterfactually through the policy, against a cost model.

Contract:

- `CostModel` is what `specctl adaptive profile` writes: the wall time of one decode step (draft +
  verify) per (batch size, steps) on one machine, steps 0 being plain decoding, settled (well after a
  prefill), and what the steps after a request joins pay beyond that (`refill_time`). `step_time(b, k)`
  interpolates linearly between measured batch sizes (and extrapolates from the last two).
- `replay(cfg, records, cost, ...)` runs the trace through the engine's own policy
  (`specctl.adaptive.policy.AdaptivePolicy`, SGLang's EMA semantics), with the counterfactual rule:
  a verify that drafted K tokens and accepted a of them would have accepted min(a, k) with any k <= K
  (greedy acceptance is a prefix test). An engine trace (with rids) is replayed per request, position by
  position, as closed-loop streams (`_replay_streams`): each replayed step verifies every active request
  once, accepting what the trace says the drafter's proposal from that position would, and costs
  `step_time(batch, longest proposal)` (a position inside a fully accepted traced verify is known only from
  below, up to the one match its bonus token leaves unknown; `_censored` draws that match at the odds the
  trace shows); the policy is fed those accepted counts (zeros at steps 0, as the
  engine does). A trace without rids is replayed verify for verify (min(a, k) + 1 tokens per request per
  traced verify). Predicted throughput is the workload's tokens over the time they take at the replayed
  rate per batch size (`Prediction`). A step above what a record drafted is only a lower bound
  (min(a, k) = a) and is counted in `Prediction.lower_bound_verifies`; `tune` never proposes one.
- `tune(setup, records, cost)` searches, per bucket (buckets keep the current config's batch-size
  keys; each scored on the batch sizes it owns, replaying the whole runs that reach it with the buckets
  chosen before it and the rest as written), candidate-step sets of up to four steps (ranked under a few
  knob profiles, `_profiles`) and then knobs (`ema_alpha`, `update_interval`, hysteresis bands, and for
  sets with 0 specctl's `zero_backoff` and `zero_threshold`, unless `setup.sglang`: `_grid`) for the best
  few, maximising the predicted tokens/s of those batch sizes; then picks the initial
  steps. The specctl-only knobs stay off (SGLang's behaviour) unless they predict at least
  `BACKOFF_MARGIN` better, since SGLang cannot run them. It returns the recommended config as a
  deployment snippet and, when SGLang can express it, as SGLang JSON; when it uses a specctl-only knob
  it also returns the best SGLang-expressible config with its own prediction (`TuneResult.sglang`).
  Plus the predictions for the current config, the best fixed step and no speculation, and the
  recommendation's own validation (`step_coverage` findings and the reachable table: the functions
  `specctl validate` runs).

Torch-free (it imports only the policy and the schemas), so it runs wherever `validate` runs.
"""

from __future__ import annotations

import functools
import itertools
import json
import math
import random
import statistics
import zlib
from collections import Counter, deque
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, NamedTuple

from specctl.adaptive.policy import AdaptivePolicy
from specctl.adaptive.trace import RequestRecord, TraceRecord
from specctl.errors import UsageError
from specctl.schemas.adaptive import (
    AdaptiveConfig,
    Bucket,
    Knobs,
    StepCoverage,
    parse_deployment_adaptive,
    parse_sglang_config,
    step_coverage,
)
from specctl.schemas.findings import Finding

COST_KIND = "specctl-cost-model"
COST_VERSION = 1
MAX_SET_SIZE = 4
ALPHAS = (0.2, 0.5, 0.8)
INTERVALS = (2, 5, 20)
# 0.5 drops a step earlier, with the EMA up to half a draft above the bar. up_hysteresis is raised to match
# when it is lower, so no recommendation has an oscillating band (validate's ADP218 warning).
# (down, up) hysteresis bands; up None = the user's up_hysteresis, raised to down when lower. The negative
# bands keep a deep step while the EMA is 1 to 3 drafts below SGLang's bar (s - 0.5): on an engine whose
# verify costs little more than a plain step, steps 7 with 3.5 of 7 drafts accepted beats steps 5.
HYSTERESES: tuple[tuple[float, float | None], ...] = (
    (-0.25, None), (0.0, None), (0.5, None), (-1.0, -0.5), (-1.5, -1.0), (-2.0, -1.5), (-2.5, -2.0), (-3.0, -2.5))
WIDE_BAND = (-2.0, -1.5)  # the band candidate sets are also ranked under (`_profiles`)
# zero_backoff values tried for candidate sets with 0 (1 = off = SGLang). With a probe step costing c plain
# steps, a never-right drafter runs at 1 / (1 + (c - 1) / (N + 1)) of no speculation once the stays reach
# N: 0.98x at N = 16, c = 1.4; 4 is for traces where the drafter recovers often and must be re-found fast.
ZERO_BACKOFFS = (1, 4, 16)
# zero_threshold values (specctl only: the EMA at or below which a bucket drops to 0, which SGLang ties to
# down_hysteresis): the first is searched with every wide band, all of them in the refinement.
ZERO_THRESHOLDS = (0.5, 0.25, 0.75, 1.0)
REFINED = 3  # configs with specctl knobs whose every zero_backoff x zero_threshold is replayed
BACKOFF_MARGIN = 0.01  # the specctl-only knob must predict >= 1% better than the best config without it
# ... unless the best config without it predicts a recorded run (a phase of useless drafts, say) below
# GUARD_RATIO x no speculation, and the one with it does not, for at most GUARD_COST of the whole: a
# config that loses a run 5% against not speculating is a worse recommendation than one 1% slower overall.
GUARD_RATIO = 0.95
GUARD_COST = 0.02
FINALISTS = 6  # candidate sets whose knobs are searched
# A bucket keeps what the user wrote unless the search's best makes the runs reaching it at least this much
# faster (or keeps a run closer to its best, `kept`): tune's own 95% intervals over resamples of a trace's
# requests span 2-5%, so a gain under half a percent is a tie, and a recommendation that rewrites a bucket on a
# tie (tiny-pd's bucket 1, replayed on a bench trace whose 4 clients leave it 2 batches of the drain: [5] -> [1]
# at 1.0001x) is noise.
KEEP_MARGIN = 0.005
# A bucket keeps its best single step unless a set of several predicts at least this much better: a replay
# of one traced draw of sampled text rewards a set that happens to leave a step where that draw went badly,
# which the next draw does not repeat. On spec_bench's random text at batch 1, {0, 5} predicted 1.3% above
# steps 5 alone and measured 0.92x and 0.96x the best fixed step in two runs; on code at batch 8, {4, 7}
# predicted 0.9% above 7 and measured 1.00x.
SET_MARGIN = 0.02
# ... unless the single step keeps a recorded run below REGRET_RATIO x that run's own best fixed step and the
# set does not (the guard's rule, against the best fixed step where GUARD_RATIO is against no speculation).
# One config for traffic that differs by run (spec_bench's code, random and mixed runs at batch 8, each run
# one workload) is the case: a set that follows each predicted 1.7% above steps 3 alone, under the margin,
# but steps 3 alone gave code 0.92x its best fixed step (6) in the replay and 0.96x measured, where the set
# kept every run within 1% of its best. A margin guards against one draw's luck; 2% of one run against that
# run's own best is a different workload, not a draw: the per-run replay is that close (spec_tuned's st7 trace,
# one config at batch 8: steps 3 alone predicted code at 0.975x its best fixed step and measured 0.978x, 0.973x
# and 0.983x in three runs; the set {0, 3, 6} that follows each workload measured 1.000x code, 0.999x random
# and 1.006x mixed, where 3 alone read 1.016x and 1.004x). Only runs the bucket serves at their full width
# count (`_search_bucket`'s `own`): a batch-8 run's drain at batch 1-4 is a few dozen verifies of a tail.
REGRET_RATIO = 0.98
# Request resamples behind the predicted speed-ups' intervals (`speedup_intervals`), fixed seed.
BOOTSTRAP = 100
BOOTSTRAP_SEED = 13
MIN_BUCKET_RECORDS = 20  # fewer verifies than this in a bucket: too little evidence, keep the user's bucket


# ---- cost model ------------------------------------------------------------------------------------


@dataclass(frozen=True)
class CostModel:
    """Seconds of one decode step per (batch size, steps), measured on one machine."""

    step_s: Mapping[int, Mapping[int, float]]  # batch size -> steps -> seconds (greedy requests)
    meta: Mapping[str, Any] = field(default_factory=dict)
    # The same table for sampled requests (rejection sampling drafts and verifies cost more), when profiled.
    sampled_step_s: Mapping[int, Mapping[int, float]] | None = None
    # Seconds the steps after a request joins (its prefill) take beyond settled ones, per (batch size, steps),
    # greedy and sampled: the cache refill a prefill costs the decode, and a new request's draft prompt pass
    # (`profile`). None in cost models written before it was measured: then no step pays it.
    refill_s: Mapping[int, Mapping[int, float]] | None = None
    sampled_refill_s: Mapping[int, Mapping[int, float]] | None = None
    # (batch size, steps, sampled, joined) -> `price`: tune replays the same steps thousands of times
    _prices: dict[tuple[int, int, float, bool], float] = field(default_factory=dict, compare=False, repr=False)

    def price(self, batch_size: int, steps: int, sampled: float, joined: bool) -> float:
        """`step_time`, plus `refill_time` when requests `joined` since the last step; memoised."""
        key = (batch_size, steps, sampled, joined)
        t = self._prices.get(key)
        if t is None:
            t = self.step_time(batch_size, steps, sampled)
            if joined:
                t += self.refill_time(batch_size, steps, sampled)
            self._prices[key] = t
        return t

    @property
    def batch_sizes(self) -> tuple[int, ...]:
        return tuple(sorted(self.step_s))

    @property
    def estimate(self) -> str | None:
        """The label of a cost model that was estimated, not measured (`meta["estimate"]`: what estimated it
        and for what), else None."""
        label = self.meta.get("estimate")
        return str(label) if label else None

    def provenance(self) -> str:
        """One line saying which cost model prices the replay: measured (where and how) or an estimate."""
        if self.estimate is not None:
            return f"an ESTIMATE, not a measurement: {self.estimate}"
        m = self.meta
        if m.get("device") is None:
            return "of unknown origin (no `adaptive profile` metadata)"
        return (f"measured by `adaptive profile` of {m.get('deployment')} on {m.get('device')} "
                f"({m.get('threads')} thread(s), {m.get('clock', 'wall')} clock, {m.get('created', 'undated')})")

    @functools.cached_property
    def steps(self) -> tuple[int, ...]:
        """Steps measured at every batch size (step_time checks every priced step against it)."""
        sets = [set(v) for v in self.step_s.values()]
        return tuple(sorted(set.intersection(*sets))) if sets else ()

    def step_time(self, batch_size: int, steps: int, sampled: float = 0.0) -> float:
        """Seconds of one step of `batch_size` requests at `steps`, `sampled` of them sampling: the greedy
        and sampled tables mixed in that proportion (greedy only when the model has no sampled table)."""
        self._covers(steps)
        t = _interpolate(self.step_s, batch_size, steps)
        if sampled > 0 and self.sampled_step_s is not None:
            frac = min(1.0, sampled / batch_size)
            t += frac * (_interpolate(self.sampled_step_s, batch_size, steps) - t)
        return t

    def _covers(self, steps: int) -> None:
        """A step is priced when measured, or between two measured ones (linear between them, `_at`): a trace
        drafting K every step holds verifies that drafted fewer (a request's max_tokens cap), and a profile of
        steps 0,1,3,5,7 must still price its 6. `tune` only proposes measured steps."""
        measured = self.steps
        if steps not in measured and not (measured and measured[0] < steps < measured[-1]):
            raise UsageError(f"the cost model has no measurement for steps {steps} (it has {list(measured)}), "
                             "nor one on each side of it",
                             hint="re-run `specctl adaptive profile` with --steps covering it")

    def refill_time(self, batch_size: int, steps: int, sampled: float = 0.0) -> float:
        """Seconds the steps after a request joins a batch of `batch_size` at `steps` pay beyond settled steps
        (`refill_s`, mixed by the sampled share as `step_time`); 0.0 when the model did not measure it."""
        if self.refill_s is None:
            return 0.0
        self._covers(steps)
        t = _interpolate(self.refill_s, batch_size, steps)
        if sampled > 0 and self.sampled_refill_s is not None:
            frac = min(1.0, sampled / batch_size)
            t += frac * (_interpolate(self.sampled_refill_s, batch_size, steps) - t)
        return max(0.0, t)

    def served(self, scale: float, join_s: float = 0.0) -> CostModel:
        """This model at served speed: every step and a refill it measured times `scale`; without a measured
        refill and with `join_s` > 0, a refill of `join_s` at every steps > 0 and none at 0 (the draft's pass
        over a joining request's prompt, which plain decoding never runs). A request that joins while an
        adaptive config runs steps 0 pays its pass when speculation resumes; replays do not charge it there."""
        def scaled(table: Mapping[int, Mapping[int, float]]) -> dict[int, dict[int, float]]:
            return {b: {k: t * scale for k, t in row.items()} for b, row in table.items()}

        def maybe(table: Mapping[int, Mapping[int, float]] | None) -> dict[int, dict[int, float]] | None:
            return None if table is None else scaled(table)

        refill = maybe(self.refill_s)
        if refill is None and join_s > 0:
            refill = {b: {k: join_s if k > 0 else 0.0 for k in row} for b, row in self.step_s.items()}
        return CostModel(scaled(self.step_s), self.meta, maybe(self.sampled_step_s), refill,
                         maybe(self.sampled_refill_s))

    def to_json(self) -> dict[str, Any]:
        tables = {"sampled_step_s": self.sampled_step_s, "refill_s": self.refill_s,
                  "sampled_refill_s": self.sampled_refill_s}
        return {
            "kind": COST_KIND,
            "version": COST_VERSION,
            **dict(self.meta),
            "batch_sizes": list(self.batch_sizes),
            "steps": list(self.steps),
            "step_s": _table_json(self.step_s),
            **{key: _table_json(t) for key, t in tables.items() if t is not None},
        }

    @classmethod
    def from_json(cls, obj: object, *, source: str = "cost model") -> CostModel:
        hint = "write one with `specctl adaptive profile -c DEPLOY --output cost.json`"
        if not isinstance(obj, dict) or obj.get("kind") != COST_KIND:
            raise UsageError(f"{source}: not a specctl cost model (kind {COST_KIND!r} missing)", hint=hint)
        out = _parse_table(obj.get("step_s"), "step_s", source, hint)
        extra: dict[str, dict[int, dict[int, float]] | None] = {}
        for key in ("sampled_step_s", "refill_s", "sampled_refill_s"):
            extra[key] = None
            if obj.get(key) is None:
                continue
            table = extra[key] = _parse_table(obj[key], key, source, hint, zero=key.endswith("refill_s"))
            if set(table) != set(out) or any(set(table[b]) != set(out[b]) for b in out):
                raise UsageError(f"{source}: {key} must measure the same (batch size, steps) points as step_s",
                                 hint=hint)
        skip = ("kind", "version", "step_s", "sampled_step_s", "refill_s", "sampled_refill_s", "batch_sizes",
                "steps")
        cm = cls(out, {k: v for k, v in obj.items() if k not in skip}, extra["sampled_step_s"], extra["refill_s"],
                 extra["sampled_refill_s"])
        if not cm.steps:
            raise UsageError(f"{source}: no steps value is measured at every batch size", hint=hint)
        return cm


def _at(row: Mapping[int, float], steps: int) -> float:
    """row[steps], linear between the nearest measured steps below and above it when it was not measured
    (`CostModel._covers` checked there are both)."""
    if steps in row:
        return float(row[steps])
    below = max(k for k in row if k < steps)
    above = min(k for k in row if k > steps)
    return float(row[below] + (row[above] - row[below]) * (steps - below) / (above - below))


def _interpolate(table: Mapping[int, Mapping[int, float]], batch_size: int, steps: int) -> float:
    """table[batch_size][steps], linear between measured batch sizes (extrapolated from the last two) and
    between measured steps (`_at`)."""
    sizes = sorted(table)
    if batch_size in table:
        return _at(table[batch_size], steps)
    if len(sizes) == 1:
        return _at(table[sizes[0]], steps) * batch_size / sizes[0]
    lo, hi = sizes[0], sizes[1]
    for a, b in itertools.pairwise(sizes):
        lo, hi = a, b
        if batch_size < b:
            break
    tl, th = _at(table[lo], steps), _at(table[hi], steps)
    t = tl + (th - tl) * (batch_size - lo) / (hi - lo)
    return float(max(t, min(tl, th) * 0.5))


def _table_json(table: Mapping[int, Mapping[int, float]]) -> dict[str, dict[str, float]]:
    return {str(b): {str(k): v for k, v in sorted(row.items())} for b, row in sorted(table.items())}


def _parse_table(table: object, key: str, source: str, hint: str, zero: bool = False) -> dict[int, dict[int, float]]:
    """A {batch size: {steps: seconds}} table; seconds > 0 (>= 0 with `zero`: a refill can be nothing)."""
    if not isinstance(table, dict) or not table:
        raise UsageError(f"{source}: {key} must map batch sizes to {{steps: seconds}}", hint=hint)
    out: dict[int, dict[int, float]] = {}
    for bkey, row in table.items():
        try:
            b = int(bkey)
        except ValueError:
            b = 0
        if b < 1 or not isinstance(row, dict) or not row:
            raise UsageError(f"{source}: {key}.{bkey}: expected a positive batch size with a steps table", hint=hint)
        out[b] = {}
        for kkey, sec in row.items():
            try:
                k = int(kkey)
            except ValueError:
                k = -1
            ok = (isinstance(sec, (int, float)) and not isinstance(sec, bool) and math.isfinite(sec)
                  and (sec >= 0 if zero else sec > 0))
            if k < 0 or not ok:
                least = ">=" if zero else ">"
                raise UsageError(f"{source}: {key}.{bkey}.{kkey}: expected steps >= 0 -> seconds {least} 0, "
                                 f"got {kkey!r}: {sec!r}", hint=hint)
            out[b][k] = float(sec)
    return out


def read_cost(path: str | Path) -> CostModel:
    try:
        obj = json.loads(Path(path).read_text())
    except OSError as exc:
        raise UsageError(f"{path}: cannot read cost model: {exc.strerror or exc}") from None
    except ValueError as exc:
        raise UsageError(f"{path}: not valid JSON ({str(exc).split(':')[0]})") from None
    return CostModel.from_json(obj, source=str(path))


# ---- counterfactual replay -------------------------------------------------------------------------


@dataclass(frozen=True)
class Prediction:
    """What replaying the trace under one config predicts.

    The replayed run has as many verifies as the trace, so it emits a different number of tokens than the
    recorded one; a real run emits the workload's tokens and takes longer or shorter. So throughput is
    predicted per batch size (tokens / seconds of the replayed verifies at that size) and combined with
    the workload's own token counts as weights: time = sum_b W_b / rate_b, tokens/s = sum_b W_b / time,
    W_b = the tokens the trace's verifies at batch size b emitted. Buckets own disjoint batch sizes, so
    maximising each bucket's time separately maximises the total.
    """

    tokens: int
    seconds: float
    verifies: int
    batches_per_steps: dict[int, int]
    switches: int
    lower_bound_verifies: int = 0  # request-verifies the trace did not determine (beyond its depth, or `_censored`)
    by_batch: dict[int, tuple[int, float, int]] = field(default_factory=dict)  # b -> (tokens, seconds, W_b)
    # seconds per output token a real run spends between its verifies whatever the config (`serving_overhead`)
    overhead_s_per_token: float = 0.0
    # served verifies' time over the cost model's price of them (`serving_overhead`): a shared machine's slowdown
    decode_scale: float = 1.0

    @property
    def predicted_seconds(self) -> float:
        """Seconds the workload's tokens take at the replayed per-batch-size rates (scaled to served verifies),
        plus the serving time between verifies."""
        work = sum(w for _, _, w in self.by_batch.values())
        return self.decode_scale * self._decode_seconds(self.by_batch.values()) + self.overhead_s_per_token * work

    @staticmethod
    def _decode_seconds(rows: Iterable[tuple[int, float, int]]) -> float:
        return sum(w * sec / tok for tok, sec, w in rows if tok > 0)

    def decode_rate(self, keep: Callable[[int], bool]) -> float:
        """Tokens/s of the batch sizes `keep` accepts, decode only (no serving overhead)."""
        rows = [row for b, row in self.by_batch.items() if keep(b)]
        seconds = self._decode_seconds(rows)
        return sum(w for _, _, w in rows) / seconds if seconds > 0 else 0.0

    @property
    def tokens_per_s(self) -> float:
        if not self.by_batch:
            t = self.decode_scale * self.seconds + self.overhead_s_per_token * self.tokens
            return self.tokens / t if t > 0 else 0.0
        t = self.predicted_seconds
        return sum(w for _, _, w in self.by_batch.values()) / t if t > 0 else 0.0

    def to_json(self) -> dict[str, Any]:
        return {
            "tokens_per_s": self.tokens_per_s,
            "replayed_tokens": self.tokens,
            "replayed_seconds": self.seconds,
            "verifies": self.verifies,
            "batches_per_steps": {str(k): v for k, v in sorted(self.batches_per_steps.items())},
            "switches": self.switches,
            "lower_bound_verifies": self.lower_bound_verifies,
            "overhead_s_per_token": self.overhead_s_per_token,
            "decode_scale": self.decode_scale,
        }


def trace_depth(records: Sequence[TraceRecord]) -> int:
    """The largest k the trace answers for every verify: its --trace-steps, else the smallest steps run."""
    ts = {r.trace_steps for r in records if r.trace_steps is not None}
    if ts:
        return min(ts)
    steps = [r.steps for r in records if r.steps is not None and r.steps > 0]
    if not steps:
        raise UsageError(
            "the trace records no steps: an `adaptive simulate` trace says what was accepted, not what was drafted",
            hint="record one with `specctl serve --trace-out FILE --trace-steps 7` (or `bench --trace-out`)",
        )
    return min(steps)


IDLE_GAP_S = 1.0  # a longer pause between two verifies of one run is an idle server, not serving overhead


@dataclass(frozen=True)
class ServingOverhead:
    """What a traced run spent beyond the cost model's price of its verifies, in the forms it takes.

    The time between consecutive verifies of one run is of two kinds. `turn`: the time between two verifies
    where no request joined (the serving loop's turn: scheduling, streaming the step's tokens to the front,
    the other processes' share of a small machine), as a share of the served time of the verify it precedes.
    It follows the steps' time, not their number nor their tokens: a similar share of the verifies' served
    time at every step count, while the mean turn varies between runs (benchmarks/RESULTS.md). So `tune` prices
    it as a factor on every step, which changes no ranking, only the ratios; priced per step or per token it
    over- or under-predicted what `bench --ab` measured.
    `between`: the rest, per emitted token: what the verifies where requests joined waited beyond their
    turn (a colocated prefill, admitting transferred KV), work every config does the
    same amount of (the prompts), so `tune` adds the same seconds per token to every prediction.
    `scale`: the served verifies' wall time over their price. A verify on a machine shared with the prefill
    server, the router and the clients runs slower than the same step profiled alone, and by a factor, not
    by a time per token: traces of tiny-pd measured their verifies at a factor of their price
    (benchmarks/RESULTS.md).
    `excess`: the verifies' time beyond their price per token, reported.
    A verify where a request joined is not a settled one in a speculating server: its drafter first runs
    the draft model over the new prompt (prefill computed the target's cache, not the draft's), which plain
    decoding never does. Served tiny-pd drafted measurably more at a join than at a settled verify
    (benchmarks/RESULTS.md). In the one scale over all verifies it priced plain decoding too, and `tune_confirm`
    over-predicted what `bench --ab` measured. So `settled_scale` is the scale of the verifies no
    request joined, `join_draft_s` the joining verifies' drafting beyond the settled median at their batch
    size (for a cost model that did not measure its own refill, a PD decode role's: a colocated profile's
    refill has the pass in it), and `served` gives `tune` the cost model at served prices with the pass a
    refill at steps > 0: every config is searched and predicted there, its decode time times 1 + `turn`
    (below 1 when the profile ran on a busier machine). `factor`, the scale with the turn on top, is
    reported."""

    between: float
    scale: float
    excess: float
    turn: float = 0.0
    settled_scale: float | None = None  # `scale` over the verifies no request joined (None: use `scale`)
    join_draft_s: float = 0.0  # served seconds a verify where requests joined drafted beyond a settled one
    source: str = "verifies"  # "requests": `request_overhead`, from request lines' decode times

    @property
    def per_token(self) -> float:
        return max(0.0, self.between)

    @property
    def factor(self) -> float:
        """What a served step takes, turn included, over its profiled price."""
        return self.scale * (1.0 + self.turn)

    def served(self, cost: CostModel) -> CostModel:
        """`cost` at the served verifies' speed (`CostModel.served`), the turn left to the predictions'
        `decode_scale`: so the join's draft pass is charged here net of it."""
        scale = self.scale if self.settled_scale is None else self.settled_scale
        return cost.served(scale, self.join_draft_s / (1.0 + self.turn))

    def to_json(self) -> dict[str, float | str | None]:
        return {"per_token_s": self.per_token, "between_verifies_s": self.between, "turn_share": self.turn,
                "verify_scale": self.scale, "served_step_factor": self.factor, "verify_excess_s": self.excess,
                "settled_scale": self.settled_scale, "join_draft_s": self.join_draft_s, "source": self.source}


def serving_overhead(records: Sequence[TraceRecord], cost: CostModel) -> ServingOverhead | None:
    """The trace's `ServingOverhead` under `cost`, or None when it lacks `time`, `draft_s` or `verify_s`
    (an older trace). Gaps over IDLE_GAP_S (a server waiting for clients) are left out. Without it a
    predicted speed-up is decode-only: a ratio of profiled prices, away from what `bench --ab` measures."""
    gap = steady = steady_served = gap_served = served = price = settled_served = settled_price = 0.0
    gap_tokens = tokens = 0
    settled_draft: dict[int, list[float]] = {}  # batch size -> drafting seconds of settled verifies (steps > 0)
    joined_draft: list[tuple[int, float]] = []  # (batch size, drafting seconds) of verifies where requests joined
    last: dict[str | None, TraceRecord] = {}
    seen: dict[str | None, set[int]] = {}
    for rec in records:
        if rec.time is None or rec.draft_s is None or rec.verify_s is None:
            return None
        emitted = sum(rec.accepted) + len(rec.accepted)
        drafted = rec.drafted_per_request
        k = max(drafted) if drafted else 0
        step = rec.draft_s + rec.verify_s
        at = cost.step_time(rec.batch_size, k, rec.sampled or 0)
        served += step
        price += at
        joined = False
        if rec.rids is not None:  # the first verify with a new request pays its join's refill, as replays do
            known = seen.setdefault(rec.run, set())
            if not known.issuperset(rec.rids):
                joined = True
                price += cost.refill_time(rec.batch_size, k, rec.sampled or 0)
                known.update(rec.rids)
        if not joined:
            settled_served += step
            settled_price += at
            if k > 0:
                settled_draft.setdefault(rec.batch_size, []).append(rec.draft_s)
        elif k > 0:
            joined_draft.append((rec.batch_size, rec.draft_s))
        tokens += emitted
        prev = last.get(rec.run)
        last[rec.run] = rec
        if prev is None or prev.time is None:
            continue
        g = rec.time - prev.time - step
        if g > IDLE_GAP_S:
            continue
        gap += max(0.0, g)
        gap_served += step
        gap_tokens += emitted
        if not joined:
            steady += max(0.0, g)
            steady_served += step
    if not tokens:
        return None
    turn = steady / steady_served if steady_served > 0 else 0.0
    join = 0.0
    if cost.refill_s is None and joined_draft and settled_draft:
        medians = {b: statistics.median(v) for b, v in settled_draft.items()}
        overall = statistics.median(t for v in settled_draft.values() for t in v)
        join = max(0.0, statistics.fmean(d - medians.get(b, overall) for b, d in joined_draft))
    return ServingOverhead((gap - turn * gap_served) / gap_tokens if gap_tokens else 0.0,
                           served / price if price > 0 else 1.0, (served - price) / tokens, turn,
                           settled_served / settled_price if settled_price > 0 else None, join)


def request_overhead(requests: Sequence[RequestRecord], records: Sequence[TraceRecord], cost: CostModel,
                     recorded: AdaptiveConfig, initial_steps: int) -> ServingOverhead | None:
    """The serving time request lines show that no config changes, for a trace without verify timings
    (SGLang's per-request statistics): each request's time to its first token (prefill, transfer, queueing),
    shared with the batch it ran in (ttft_s / batch_size, summed), per token the replayed run emits. What
    speculation shortens, the decode, is left to the cost model: how much slower than profiled the served
    steps ran is a factor on every config (ratio-neutral), which without verify timings cannot be told
    from the turn between verifies, so the prediction is otherwise decode-only. `recorded` (the config the
    requests ran under) weighs the tokens. None when a request lacks its time to first token."""
    timed = [r for r in requests if r.verify_ct]
    if not timed or any(r.ttft_s is None for r in timed):
        return None
    before = sum((r.ttft_s or 0.0) / r.batch_size for r in timed)
    pred = replay(recorded, records, cost, initial_steps=initial_steps)
    work = sum(w for _, _, w in pred.by_batch.values())
    if work <= 0:
        return None
    return ServingOverhead(before / work, 1.0, 0.0, source="requests")


def _drafted(rec: TraceRecord) -> tuple[int, ...]:
    d = rec.drafted_per_request
    return d if d is not None else rec.accepted


def _limits(rec: TraceRecord) -> tuple[int | None, ...]:
    """Per request, the most the drafter would have proposed at this verify whatever it was asked for: the
    traced drafts where it proposed fewer than the verify's steps (an n-gram miss or short match, the
    max_tokens cap), else None (it drafted all it was asked: a larger k would have drafted more)."""
    if rec.drafted is None or rec.steps is None:
        return (None,) * len(rec.accepted)
    return tuple(d if d < rec.steps else None for d in rec.drafted)


class _Facts(NamedTuple):
    """One run's per-request facts for the positional replay (`_position_facts`, `_sampled_share`)."""

    exact: dict[int, dict[int, int]]
    lower: dict[int, dict[int, int]]
    total: dict[int, int]
    limit: dict[int, dict[int, int]]
    share: dict[int, float]
    width: int  # the run's largest traced batch: how many streams it is replayed as
    # P(a verify's last draft is accepted | all before it were), at the trace's own depth: the chance that the
    # one match a fully accepted traced verify leaves unknown (its bonus position) holds (`_censored`)
    cont: float = 0.0


@dataclass(frozen=True)
class Runs:
    """A trace split into its runs (one engine each, in first-seen order), each with its positional facts
    when every record has rids: what every replay of the trace shares, computed once (`tune` replays the
    same records thousands of times)."""

    runs: tuple[tuple[tuple[TraceRecord, ...], _Facts | None], ...]

    @classmethod
    def of(cls, records: Sequence[TraceRecord]) -> Runs:
        grouped: dict[str | None, list[TraceRecord]] = {}
        for rec in records:
            if rec.accepted:
                grouped.setdefault(rec.run, []).append(rec)
        out = []
        for recs in grouped.values():
            facts = None
            if all(r.rids is not None for r in recs):
                facts = _Facts(*_position_facts(recs), _sampled_share(recs), max(r.batch_size for r in recs),
                               _continuation(recs))
            out.append((tuple(recs), facts))
        return cls(tuple(out))


def resample_requests(runs: Runs, rng: random.Random) -> Runs | None:
    """`runs` with each run's requests drawn again with replacement (as many, in a random order, each run
    on its own): one bootstrap replicate of the trace. None when a run has no positional facts (no rids)."""
    out = []
    for recs, facts in runs.runs:
        if facts is None:
            return None
        rids = list(facts.total)
        pick = [rng.choice(rids) for _ in rids]
        out.append((recs, _Facts({i: facts.exact[r] for i, r in enumerate(pick)},
                                 {i: facts.lower[r] for i, r in enumerate(pick)},
                                 {i: facts.total[r] for i, r in enumerate(pick)},
                                 {i: facts.limit[r] for i, r in enumerate(pick)},
                                 {i: facts.share.get(r, 0.0) for i, r in enumerate(pick)}, facts.width,
                                 facts.cont)))
    return Runs(tuple(out))


def replay(
    cfg: AdaptiveConfig,
    records: Sequence[TraceRecord] | Runs,
    cost: CostModel,
    *,
    initial_steps: int,
    graph_batch_sizes: Sequence[int] = (),
) -> Prediction:
    """Predicted tokens and seconds of running `records` under `cfg` (see the module docstring).

    Each run of the trace (`TraceRecord.run`: one engine) gets a policy of its own, started fresh, as that
    engine did. A run with rids is replayed position by position as closed-loop streams (`_replay_streams`):
    the replayed policy sees the verifies a real run at its steps would, not the traced run's fewer, longer
    ones, which matters to a policy deciding every N verifies and to shallow steps, which a deep trace's
    long accepted runs would otherwise undercount. Runs without rids (older traces) are replayed verify for
    verify (min(a, k) per traced verify). Pass `Runs.of(records)` to replay one trace many times."""
    runs = records if isinstance(records, Runs) else Runs.of(records)
    acc = _Tally()
    for recs, facts in runs.runs:
        policy = AdaptivePolicy(cfg, initial_steps=initial_steps, graph_batch_sizes=graph_batch_sizes,
                                clock=lambda: 0.0)
        if facts is not None:
            _replay_streams(policy, facts, cost, acc)
        else:
            _replay_verifies(policy, recs, cost, acc)
        acc.switches += len(policy.switches)
    table = {b: (int(t), sec, int(w)) for b, (t, sec, w) in acc.by_batch.items()}
    return Prediction(acc.tokens, acc.seconds, sum(acc.used.values()), dict(acc.used), acc.switches, acc.lower,
                      table)


@dataclass
class _Tally:
    tokens: int = 0
    seconds: float = 0.0
    used: Counter[int] = field(default_factory=Counter)
    lower: int = 0
    switches: int = 0
    by_batch: dict[int, list[float]] = field(default_factory=dict)  # b -> [tokens, seconds, W_b]

    def verify(self, batch: int, steps: int, emitted: int, seconds: float) -> None:
        row = self.by_batch.setdefault(batch, [0.0, 0.0, 0.0])
        row[0] += emitted
        row[1] += seconds
        self.tokens += emitted
        self.seconds += seconds
        self.used[steps] += 1

    def weight(self, batch: int, emitted: int) -> None:
        """What the recorded run emitted at this batch size: the workload's weight."""
        self.by_batch.setdefault(batch, [0.0, 0.0, 0.0])[2] += emitted


def _replay_verifies(policy: AdaptivePolicy, recs: Sequence[TraceRecord], cost: CostModel, acc: _Tally) -> None:
    """Verify for verify: the traced verify, had it drafted k, accepted min(a, k) per request."""
    for rec in recs:
        n = len(rec.accepted)
        acc.weight(rec.batch_size, sum(rec.accepted) + n)
        k = policy.bucket_for_batch(rec.batch_size).steps
        priced = k
        if k == 0:
            got = [0] * n
        else:
            drafted = _drafted(rec)
            limits = _limits(rec)
            if any(a == d and k > d and lim is None for a, d, lim in zip(rec.accepted, drafted, limits, strict=True)):
                acc.lower += 1
            got = [min(a, k) for a in rec.accepted]
            # a drafter that proposed fewer than it was asked for (an n-gram miss) would at k propose min(k, d):
            # the verify spans the longest proposal, not k
            priced = max(min(k, lim) if lim is not None else k for lim in limits)
        price = cost.price(rec.batch_size, priced, rec.sampled or 0, False)
        if rec.from_requests:  # a lockstep batch of request lines may hold fewer than batch_size: its share
            price *= n / rec.batch_size
        acc.verify(rec.batch_size, k, sum(got) + n, price)
        policy.on_verify_complete(got, rec.batch_size)


def _replay_streams(policy: AdaptivePolicy, facts: _Facts, cost: CostModel, acc: _Tally) -> None:
    """Position by position, as closed-loop streams: the run's requests in first-seen order, as many at once as
    its largest traced batch (C), the next one joining as one finishes (spec_bench's streams, bench's
    --max-concurrency clients; C = 1 is a single stream). Every step verifies each active request once: at
    output position p with k drafts it accepts min(L(p), k), L from the traced verifies (`_position_facts`;
    where the trace only bounds L below k, inside a traced verify that accepted all its drafts, `_censored`
    estimates it, counted in `lower_bound_verifies`), and the step is priced
    at the batch's longest proposal, plus the cost model's refill at a step that follows requests joining
    (requests of a plain run, all as long, finish and are replaced together; a speculating run's one by
    one, each join paying the refill). So the replayed policy sees the verifies a real run at its steps would:
    more of them where acceptance runs long and the steps are short, which a verify-for-verify replay of a
    deep trace cannot show (it favoured deep steps at batch 8)."""
    exact, lower, total, limit, share, width, cont = facts
    pending = deque(total)
    active = [pending.popleft() for _ in range(min(width, len(pending)))]
    pos = dict.fromkeys(total, 0)
    joined = True  # the first step follows the first requests' prefill
    while active:
        b = len(active)
        k = policy.steps_for_batch(b)
        got: list[int] = []
        priced = emitted = 0
        for rid in active:
            p, n = pos[rid], total[rid]
            # the engine never drafts past max_tokens, nor a drafter past what it found (`_limits`)
            drafted = max(0, min(k, n - 1 - p, limit[rid].get(p, k)))
            a = _accepted_at(exact[rid], lower[rid], p, drafted)
            if a is None:  # only bounded below: the bound, plus the unknown match as the trace's odds have it
                a = _censored(exact[rid], lower[rid], rid, p, drafted, cont)
                acc.lower += 1
            got.append(a)
            emitted += a + 1
            priced = max(priced, drafted)
            pos[rid] = p + a + 1
        acc.weight(b, emitted)
        sampled = sum(share[r] for r in active)
        # requests joined since the last step pay their prefill's refill (`CostModel.refill_s`)
        acc.verify(b, k, emitted, cost.price(b, priced, sampled, joined))
        policy.on_verify_complete(got, b)
        active = [r for r in active if pos[r] < total[r]]
        joined = bool(pending) and len(active) < width
        while pending and len(active) < width:
            active.append(pending.popleft())


def _continuation(recs: Sequence[TraceRecord]) -> float:
    """P(the d-th draft is accepted | the first d - 1 were) over the traced request-verifies that drafted their
    verify's full steps d (not a drafter's short proposal): how often a run of accepted drafts goes on one more
    at the trace's depth, with one success and one failure added (Laplace's rule: a short trace whose few
    runs all went on does not make every unknown match a hit). 0.0 without such verifies."""
    went_on = reached = 0
    for rec in recs:
        if not rec.steps:
            continue
        for a, d in zip(rec.accepted, _drafted(rec), strict=True):
            if d == rec.steps and a >= d - 1:
                reached += 1
                went_on += a == d
    return (went_on + 1) / (reached + 2) if reached else 0.0


def _censored(exact: Mapping[int, int], lower: Mapping[int, int], rid: int, p: int, drafted: int,
              cont: float) -> int:
    """Drafts a verify at p with `drafted` drafts accepts where the trace only bounds L(p) >= b below it: the
    traced verify that accepted all its drafts leaves one match unknown, at its bonus position p + b (the
    target's own token, which its drafter never proposed). With probability `cont` that match holds and L(p)
    runs on through the next traced verify's facts (L = b + 1 + L(p + b + 1)); else L(p) = b. The draw is
    a fixed hash of (request, position), so every config replayed meets the same matches (a paired
    comparison), and over many censored positions the count comes out near the real one, where the bound
    alone counts every unknown match a miss: from a trace at 7, steps 5 at batch 8 was predicted 9% slower
    than 7 where real runs measured it 3% faster."""
    got = 0
    while True:
        b = lower.get(p, 0)
        if got + b >= drafted:
            return drafted
        bonus = p + b
        if zlib.crc32(f"{rid}/{bonus}".encode()) >= cont * 2**32:
            return got + b
        got += b + 1
        q = bonus + 1
        if got >= drafted:
            return drafted
        if q in exact:
            return min(got + exact[q], drafted)
        if q not in lower:
            return got
        p = q


def _sampled_share(recs: Sequence[TraceRecord]) -> dict[int, float]:
    """Per request, 1.0 when it samples, 0.0 when greedy: known from a record of its own, or of a batch all
    greedy or all sampling; otherwise the run's sampled fraction (the cost tables mix in that proportion)."""
    known: dict[int, float] = {}
    seen: set[int] = set()
    n = s = 0
    for r in recs:
        rids = r.rids or ()
        seen.update(rids)
        n += len(rids)
        s += r.sampled or 0
        if r.sampled is not None and r.sampled in (0, len(rids)):
            for rid in rids:
                known[rid] = 1.0 if r.sampled else 0.0
    frac = s / n if n else 0.0
    return {rid: known.get(rid, frac) for rid in seen}


def _position_facts(
    records: Sequence[TraceRecord],
) -> tuple[dict[int, dict[int, int]], dict[int, dict[int, int]], dict[int, int], dict[int, dict[int, int]]]:
    """Per request: exact L(p), lower bounds on L(p), how many tokens its verifies emitted (in first-seen
    request order), and the drafter's limit at the positions where a traced verify drafted fewer than its
    steps (`_limits`). A traced verify at p that drafted d and accepted a < d fixes L(p + j) = a - j for
    j <= a; one that accepted all d only bounds L(p + j) >= d - j, unless d was the drafter's limit: then a
    verify at p drafts at most d, and accepting all of them is exact."""
    exact: dict[int, dict[int, int]] = {}
    lower: dict[int, dict[int, int]] = {}
    total: dict[int, int] = {}
    limit: dict[int, dict[int, int]] = {}
    for rec in records:
        if rec.rids is None:
            raise UsageError("the trace has no rids: positional replay needs an engine trace (--trace-out)")
        for rid, a, d, lim in zip(rec.rids, rec.accepted, _drafted(rec), _limits(rec), strict=True):
            p = total.get(rid, 0)
            ex, lo, li = exact.setdefault(rid, {}), lower.setdefault(rid, {}), limit.setdefault(rid, {})
            if lim is not None:
                li[p] = lim
            for j in range(a + 1):
                if a < d:
                    ex[p + j] = a - j
                else:
                    lo[p + j] = d - j
            total[rid] = p + a + 1
    return exact, lower, total, limit


def _accepted_at(exact: Mapping[int, int], lower: Mapping[int, int], p: int, drafted: int) -> int | None:
    """Drafts a verify at output position p with `drafted` drafts accepts (see `_position_facts`), or None
    when the trace only bounds it below `drafted`."""
    if drafted == 0:
        return 0
    if p in exact:
        return min(exact[p], drafted)
    if lower.get(p, -1) >= drafted:
        return drafted
    return None


class Unanswerable(ValueError):
    """The trace does not determine what a replayed verify would have accepted."""


def replay_positions(records: Sequence[TraceRecord], steps: int, *, strict: bool = True) -> dict[int, list[int]]:
    """Exact per-request replay of greedy decoding at fixed `steps` from a deeper trace (needs `rids`).

    With greedy target and drafter, what a verify accepts depends only on where it starts: the drafter's
    proposals are its greedy continuation of the (correct) text, so a verify starting at output position
    p accepts min(L(p), drafted), L(p) being how many of the drafter's next tokens match the target's
    from p. A traced verify at p that drafted d and accepted a < d fixes L(p + j) = a - j for j <= a; one
    that accepted all d only bounds L(p + j) >= d - j. A drafter that proposed d below the traced steps
    (prompt lookup finding a short or no match) proposes min(k, d) there at any k: its continuation capped
    at k, which the greedy acceptance test only shortens. Following each request's verifies in trace order
    gives those facts; replaying `steps` then walks the same positions the real run would (drafting
    min(steps, tokens left - 1), as the engine caps it). Returns rid -> accepted drafts per verify, the
    `accepted_per_step` a real run at `steps` records. Where the trace only bounds L below the drafted
    count (a position right after a fully accepted traced verify) it raises `Unanswerable`, or with
    `strict=False` ends that request's list there (a prefix of the real run's).
    """
    exact, lower, total, limit = _position_facts(records)
    out: dict[int, list[int]] = {}
    for rid, n in total.items():
        accepted: list[int] = []
        p = 0
        while p < n:
            # tokens emitted by verifies so far: p; the engine drafts at most max_tokens - len(output) - 1
            # = (n + 1) - (p + 1) - 1 = n - 1 - p (n + 1 tokens in all, the first one from prefill), and a
            # drafter no more than it proposed where the trace saw it propose fewer than asked (an n-gram miss)
            drafted = max(0, min(steps, n - 1 - p, limit[rid].get(p, steps)))
            a = _accepted_at(exact[rid], lower[rid], p, drafted)
            if a is None:
                if strict:
                    raise Unanswerable(f"request {rid}: the trace does not say whether {drafted} drafts at output "
                                       f"position {p} would all be accepted")
                break
            accepted.append(a)
            p += a + 1
        out[rid] = accepted
    return out


def trace_notes(records: Sequence[TraceRecord], depth: int, cost: CostModel) -> tuple[str, ...]:
    """What `tune` says about its trace: the depth that bounds the recommendation, and for verifies built
    from per-request histograms, which predictions are exact and what the adaptive replay assumes."""
    above = [k for k in cost.steps if k > depth]
    notes = [f"the trace was recorded at steps {depth}: a verify that drafted {depth} says nothing of a longer "
             f"draft, so nothing above {depth} is recommended"
             + (f" (the cost model's steps {', '.join(map(str, above))} were left out; record at a larger "
                "launch-time steps to search them)" if above else "")]
    hist = sum(1 for r in records if r.from_requests)
    if hist:
        notes.append(
            f"{hist} of the trace's {len(records)} verify batches come from per-request histograms "
            "(SGLang's spec_correct_drafts_histogram): a fixed step's tokens per traced verify are exact from "
            "them (min(a, k) in any order); the replay position by position and the adaptive policy assume an "
            "order: each request's verifies spread evenly over its life, the requests of one observed "
            "concurrency verifying in lockstep (docs/adaptive.md: what a histogram cannot tell)")
    return tuple(notes)


def fixed_config(steps: int) -> AdaptiveConfig:
    """One bucket with one candidate: the policy never moves (fixed steps, or 0 = no speculation)."""
    return AdaptiveConfig((Bucket(1, (steps,), Knobs()),))


# ---- search ----------------------------------------------------------------------------------------


@dataclass(frozen=True)
class TuneSetup:
    """What `tune` needs from the current deployment/config (built by the CLI from `load_setup`)."""

    cfg: AdaptiveConfig
    initial_steps: int
    graph_batch_sizes: tuple[int, ...] = ()
    max_batch_size: int | None = None
    steps: tuple[int, ...] | None = None  # search only these steps (default: every measured step <= the depth)
    sglang: bool = False  # search only what SGLang can run (no specctl-only knobs: zero_backoff, zero_threshold)
    decode_only: bool = False  # predict decode speed alone (leave the trace's serving overhead out)


@dataclass(frozen=True)
class SGLangChoice:
    """The best config SGLang can run, when the recommendation needs a specctl-only knob."""

    cfg: AdaptiveConfig
    initial_steps: int
    predicted: Prediction

    def to_json(self, none: Prediction) -> dict[str, Any]:
        return {"sglang_adaptive_config": sglang_json(self.cfg), "initial_steps": self.initial_steps,
                "predicted": self.predicted.to_json(),
                "speedup_vs_none": _ratio(self.predicted, none)}


def _ratio(p: Prediction, base: Prediction) -> float:
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
        return _ratio(self.recommended, self.best_fixed)

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
        vs_fixed.append(_ratio(rec, adjust(replay(fixed, rep, cost, initial_steps=best_k))))
        vs_none.append(_ratio(rec, adjust(replay(none, rep, cost, initial_steps=0))))

    def band(xs: list[float]) -> tuple[float, float]:
        xs = sorted(xs)
        return xs[int(0.025 * (len(xs) - 1))], xs[math.ceil(0.975 * (len(xs) - 1))]

    return {"vs_best_fixed": band(vs_fixed), "vs_none": band(vs_none)}


@dataclass(frozen=True)
class TuneResult:
    recommended: AdaptiveConfig
    initial_steps: int
    predicted: Prediction
    current: Prediction
    best_fixed_steps: int
    best_fixed: Prediction
    none: Prediction
    allowed_steps: tuple[int, ...]
    coverage: StepCoverage
    findings: tuple[Finding, ...]
    evaluated: int
    sglang: SGLangChoice | None = None  # set when `recommended` uses a specctl-only knob
    sglang_only: bool = False  # the search was restricted to what SGLang can run
    overhead: ServingOverhead | None = None  # serving overhead in the predictions (None: decode only)
    runs: tuple[RunBreakdown, ...] = ()  # each recorded run alone: the recommendation vs its best fixed step
    intervals: dict[str, tuple[float, float]] | None = None  # `speedup_intervals` (None: no positional facts)
    notes: tuple[str, ...] = ()  # what bounds the search and which replay the trace allowed (`trace_notes`)
    cost_model: str = ""  # `CostModel.provenance` of the model that priced it
    cost_estimated: bool = False

    @property
    def overhead_s_per_token(self) -> float | None:
        return self.overhead.per_token if self.overhead is not None else None

    def speedups(self) -> dict[str, float]:
        p = self.predicted
        return {"vs_current": _ratio(p, self.current), "vs_best_fixed": _ratio(p, self.best_fixed),
                "vs_none": _ratio(p, self.none)}

    @property
    def specctl_only(self) -> tuple[str, ...]:
        """specctl-only knobs the recommendation uses (empty: SGLang runs it as is)."""
        return self.recommended.specctl_only

    def sglang_json(self) -> dict[str, Any] | None:
        """The recommendation as SGLang JSON; None when SGLang cannot express it (see `sglang`)."""
        return None if self.specctl_only else sglang_json(self.recommended)

    def deployment_snippet(self) -> str:
        return deployment_snippet(self.recommended, self.initial_steps)

    def deployment_adaptive(self) -> dict[str, Any]:
        return deployment_adaptive(self.recommended)

    def to_json(self) -> dict[str, Any]:
        rec: dict[str, Any] = {
            "sglang_adaptive_config": self.sglang_json(), "initial_steps": self.initial_steps,
            "deployment_snippet": self.deployment_snippet(), "deployment_adaptive": self.deployment_adaptive(),
            "specctl_only_knobs": list(self.specctl_only),
        }
        if self.specctl_only:
            rec["sglang_note"] = (
                f"SGLang cannot express {', '.join(self.specctl_only)} (its loader ignores the key): run this "
                "config with engine: builtin; the best config SGLang can run is under 'sglang'")
        return {
            "recommended": rec,
            "sglang": self.sglang.to_json(self.none) if self.sglang is not None else None,
            "search": {"sglang_only": self.sglang_only},
            "predicted": self.predicted.to_json(),
            "current": self.current.to_json(),
            "best_fixed": {"steps": self.best_fixed_steps, **self.best_fixed.to_json()},
            "none": self.none.to_json(),
            "speedup": self.speedups(),
            "speedup_ci95": {k: list(v) for k, v in self.intervals.items()} if self.intervals is not None else None,
            "allowed_steps": list(self.allowed_steps),
            "evaluated_configs": self.evaluated,
            "serving_overhead_s_per_token": self.overhead_s_per_token,
            "serving_overhead": self.overhead.to_json() if self.overhead is not None else None,
            "validation": {"coverage": self.coverage.to_json(), "findings": [f.to_json() for f in self.findings]},
            "runs": [r.to_json() for r in self.runs],
            "notes": list(self.notes),
            "cost_model": {"provenance": self.cost_model, "estimate": self.cost_estimated},
        }


_KNOB_FIELDS = ("ema_alpha", "update_interval", "warmup_batches", "down_hysteresis", "up_hysteresis",
                "ceiling_coeff")


def sglang_json(cfg: AdaptiveConfig) -> dict[str, Any]:
    """The config as SGLang's `--speculative-adaptive-config` JSON (every knob written in its bucket).

    Only SGLang's knobs: a config with a specctl-only knob set is refused (ValueError), never silently
    written without it (SGLang would run another policy)."""
    if cfg.specctl_only:
        raise ValueError(f"SGLang cannot express {', '.join(cfg.specctl_only)}; use deployment_adaptive(cfg)")
    out: dict[str, Any] = {}
    for b in cfg.buckets:
        entry: dict[str, Any] = {"candidate_steps": list(b.candidate_steps)}
        for name in _KNOB_FIELDS:
            entry[name] = getattr(b.knobs, name)
        out[str(b.min_batch_size)] = entry
    return out


def _bucket_knobs(b: Bucket) -> dict[str, Any]:
    """A bucket's knobs as written in a deployment: SGLang's all, specctl-only ones where set."""
    return {**{n: getattr(b.knobs, n) for n in _KNOB_FIELDS}, **{n: getattr(b.knobs, n) for n in b.knobs.specctl_only}}


def deployment_adaptive(cfg: AdaptiveConfig) -> dict[str, Any]:
    """The config as a deployment's `speculative.adaptive` block (a dict; specctl-only knobs included)."""
    return {"strategy": "ema", "buckets": {str(b.min_batch_size): {"candidate_steps": list(b.candidate_steps),
                                                                   **_bucket_knobs(b)} for b in cfg.buckets}}


def deployment_snippet(cfg: AdaptiveConfig, initial_steps: int) -> str:
    """The same config as a deployment file's `speculative` block (YAML)."""
    lines = ["speculative:", f"  num_steps: {initial_steps}", "  adaptive:", "    strategy: ema", "    buckets:"]
    for b in cfg.buckets:
        knobs = ", ".join(f"{n}: {v}" for n, v in _bucket_knobs(b).items())
        steps = ", ".join(map(str, b.candidate_steps))
        lines.append(f"      {b.min_batch_size}: {{candidate_steps: [{steps}], {knobs}}}")
    return "\n".join(lines) + "\n"


def _route_key(cfg: AdaptiveConfig, batch_size: int, graphs: Sequence[int]) -> int:
    return cfg.route(batch_size, graphs).min_batch_size


def _bucket_score(cfg: AdaptiveConfig, key: int, runs: Runs, cost: CostModel, graphs: Sequence[int]) -> float:
    """Predicted tokens/s of the batch sizes bucket `key` owns (decode only), replaying whole runs under `cfg`
    (the other buckets as they stand): a positional replay needs every verify of a request, whichever bucket
    ran it."""
    pred = replay(cfg, runs, cost, initial_steps=-1, graph_batch_sizes=graphs)
    return pred.decode_rate(lambda b: _route_key(cfg, b, graphs) == key)


def _run_rates(cfg: AdaptiveConfig, runs: Runs, cost: CostModel, graphs: Sequence[int],
               keep: Callable[[int], bool], initial_steps: int = -1) -> list[float]:
    """Each run's predicted decode tokens/s under `cfg`, replayed alone, at the batch sizes `keep` accepts."""
    return [replay(cfg, Runs((run,)), cost, initial_steps=initial_steps, graph_batch_sizes=graphs).decode_rate(keep)
            for run in runs.runs]


def _worst_ratio(rates: Sequence[float], bases: Sequence[float]) -> float:
    """The lowest rate / base over the runs (runs with no base rate count 1.0)."""
    return min((r / top for r, top in zip(rates, bases, strict=True) if top > 0), default=1.0)


def _worst_run_ratio(cfg: AdaptiveConfig, runs: Runs, cost: CostModel, graphs: Sequence[int],
                     keep: Callable[[int], bool], initial_steps: int = -1) -> float:
    """The lowest, over the runs, of a run's predicted decode tokens/s under `cfg` over its tokens/s without
    speculation, at the batch sizes `keep` accepts (runs with none there count 1.0)."""
    return _worst_ratio(_run_rates(cfg, runs, cost, graphs, keep, initial_steps),
                        _run_rates(fixed_config(0), runs, cost, (), keep, 0))


def _guard_prefers(guarded: float, unguarded: float, guarded_score: float, unguarded_score: float) -> bool:
    """True when the config that scored `guarded_score` should win although it scored less: it keeps every
    run at GUARD_RATIO x no speculation or better, the other does not, and it costs at most GUARD_COST."""
    return (unguarded < GUARD_RATIO <= guarded
            and guarded_score >= unguarded_score * (1 - GUARD_COST))


def _with_bucket(cfg: AdaptiveConfig, bucket: Bucket) -> AdaptiveConfig:
    return replace(cfg, buckets=tuple(bucket if b.min_batch_size == bucket.min_batch_size else b
                                      for b in cfg.buckets))


def _profiles(knobs: Knobs, cands: tuple[int, ...], specctl: bool) -> list[Knobs]:
    """The knobs a candidate set is ranked under (its best score among them): SGLang's bars (the user's knobs),
    the wide band (`WIDE_BAND`), and with specctl's knobs for a set with 0 each of those with the back-off
    and the wide one with its own bar to 0. A set's worth depends on its bars: a deep step beside a middle
    one pays only if the EMA can hold it while half its drafts are accepted."""
    if len(cands) < 2:
        return [knobs]  # one candidate never moves: knobs change nothing
    down, up = WIDE_BAND
    wide = replace(knobs, down_hysteresis=down, up_hysteresis=up)
    out = [knobs, wide]
    if specctl and 0 in cands:
        out += [replace(knobs, zero_backoff=ZERO_BACKOFFS[-1]), replace(wide, zero_threshold=ZERO_THRESHOLDS[0]),
                replace(wide, zero_threshold=ZERO_THRESHOLDS[0], zero_backoff=ZERO_BACKOFFS[-1])]
    return out


def _grid(knobs: Knobs, cands: tuple[int, ...], specctl: bool) -> Iterable[Knobs]:
    """The knob settings a finalist set is replayed under: alpha x interval x hysteresis band, each as SGLang
    runs it and, for a set with 0 (specctl's knobs allowed), with the longest back-off (and the first bar to 0
    for the wide bands, whose own bar, 0.5 + down_hysteresis, drops to 0 late or never). The search then
    varies the specctl knobs of the best few (REFINED)."""
    for alpha, interval, (down, up) in itertools.product(ALPHAS, INTERVALS, HYSTERESES):
        up = max(knobs.up_hysteresis, down) if up is None else up
        plain = replace(knobs, ema_alpha=alpha, update_interval=interval, down_hysteresis=down, up_hysteresis=up)
        yield plain
        if specctl and 0 in cands:
            yield replace(plain, zero_backoff=ZERO_BACKOFFS[-1],
                          zero_threshold=ZERO_THRESHOLDS[0] if down < -0.5 else None)


def _search_bucket(base: AdaptiveConfig, b: Bucket, runs: Runs, cost: CostModel,
                   graphs: Sequence[int], allowed: Sequence[int],
                   specctl: bool) -> tuple[Bucket, float, Bucket, float, int]:
    """(best bucket, its score, best bucket SGLang can run, its score, configs replayed) for one bucket of
    `base` (`runs` replayed with the other buckets as in `base`).

    `specctl`: also try specctl's own knobs (zero_backoff, zero_threshold) for candidate sets with 0."""
    evaluated = 0
    base_knobs = replace(b.knobs, strategy="ema").sglang
    # the best bucket found so far without (False) and with (True) a specctl-only knob: (score, bucket)
    best: dict[bool, tuple[float, Bucket]] = {False: (-math.inf, b), True: (-math.inf, b)}
    single_score, single = -math.inf, b
    on_side: list[tuple[float, Bucket]] = []  # every config with a specctl-only knob replayed, for the refinement

    def consider(cand: Bucket) -> float:
        nonlocal evaluated
        score = _bucket_score(_with_bucket(base, cand), b.min_batch_size, runs, cost, graphs)
        evaluated += 1
        side = bool(cand.knobs.specctl_only)
        if score > best[side][0] * (1 + 1e-9) or best[side][0] == -math.inf:
            best[side] = (score, cand)
        if side:
            on_side.append((score, cand))
        return score

    scored: list[tuple[float, tuple[int, ...]]] = []  # ranking score: the best of the set's profiles
    for size in range(1, MAX_SET_SIZE + 1):
        for cands in itertools.combinations(allowed, size):
            rank = max(consider(Bucket(b.min_batch_size, cands, k)) for k in _profiles(base_knobs, cands, specctl))
            if size == 1 and rank > single_score * (1 + 1e-9):
                single_score, single = rank, Bucket(b.min_batch_size, cands, base_knobs)
            scored.append((rank, cands))
    scored.sort(key=lambda t: (-t[0], len(t[1]), t[1]))
    for _, cands in scored[:FINALISTS]:
        if len(cands) > 1:
            for knobs in _grid(base_knobs, cands, specctl):
                consider(Bucket(b.min_batch_size, cands, knobs))
    # refine: every zero_backoff x zero_threshold for the best few configs with specctl knobs
    tops = list(dict.fromkeys(cand for _, cand in sorted(on_side, key=lambda t: -t[0])))[:REFINED]
    for top in tops:
        for zb, zt in itertools.product(ZERO_BACKOFFS, (None, *ZERO_THRESHOLDS)):
            consider(replace(top, knobs=replace(top.knobs, zero_backoff=zb, zero_threshold=zt)))
    (off_score, best_off), (on_score, best_on) = best[False], best[True]

    def keep(size: int) -> bool:
        return _route_key(_with_bucket(base, best_off), size, graphs) == b.min_batch_size

    def worst(cand: Bucket) -> float:
        return _worst_run_ratio(_with_bucket(base, cand), runs, cost, graphs, keep)

    best_fixed: list[float] = []  # per run: its best fixed step's decode tokens/s in this bucket (lazily)
    # The runs this bucket serves at their full width: a batch-8 run's drain at batch 1-4 is its tail, not
    # its traffic, and too few verifies to say which step that traffic wants (`regret`).
    own = Runs(tuple(run for run in runs.runs if keep(max(r.batch_size for r in run[0]))))

    def regret(cand: Bucket) -> float:
        """The lowest, over the runs this bucket serves at their full width (`own`), of a run's predicted
        decode tokens/s under `cand` over its best fixed step's, at this bucket's batch sizes (the other
        buckets as in `base`)."""
        nonlocal evaluated

        def rates(bucket: Bucket) -> list[float]:
            return _run_rates(_with_bucket(base, bucket), own, cost, graphs, keep)

        if not best_fixed:
            per_step = [rates(Bucket(b.min_batch_size, (k,), base_knobs)) for k in allowed]
            evaluated += len(allowed) * len(own.runs)
            best_fixed.extend(max(col) for col in zip(*per_step, strict=True))
        evaluated += len(own.runs)
        return _worst_ratio(rates(cand), best_fixed)

    def holds_as_well(alt: Bucket, cand: Bucket) -> bool:
        """`alt` loses no run that `cand` keeps: none below GUARD_RATIO x no speculation (or no further below it
        than under `cand`), none below REGRET_RATIO x its best fixed step (or no further below it)."""
        nonlocal evaluated
        evaluated += 2 * len(runs.runs)
        return worst(alt) >= min(GUARD_RATIO, worst(cand)) and regret(alt) >= min(REGRET_RATIO, regret(cand))

    def simplest(cand: Bucket, score: float) -> tuple[Bucket, float]:
        """`cand`, or the best single step where the set's edge over it is within a trace's noise (SET_MARGIN),
        unless the single step alone loses a run the set keeps: a phase of useless drafts (the guard's bar,
        against no speculation), or a run whose traffic wants another step (below REGRET_RATIO x the run's
        best fixed step, where the set keeps it closer: the guard's rule, against the best fixed step)."""
        if len(cand.candidate_steps) > 1 and score < single_score * (1 + SET_MARGIN) and holds_as_well(single, cand):
            return single, single_score
        return cand, score

    @functools.cache
    def whole(cand: Bucket) -> float:
        """Decode tokens/s of every batch size of the runs reaching this bucket, with `cand` in it."""
        return replay(_with_bucket(base, cand), runs, cost, initial_steps=-1,
                      graph_batch_sizes=graphs).decode_rate(lambda _: True)

    def kept(cand: Bucket, score: float) -> tuple[Bucket, float]:
        """The user's bucket `b` in place of `cand` when `cand` makes the runs reaching this bucket less than
        KEEP_MARGIN faster (all their batch sizes: a bucket that serves a run's last few batches moves little
        however its own rate changes) and keeps no run closer to no speculation (the guard) or to its best fixed
        step (the regret) than `b` does: a change the replay cannot tell from a tie is no recommendation. Only
        where `b` runs steps the search may run (measured, within the trace's depth), and SGLang's knobs alone
        when `cand` has none of specctl's."""
        nonlocal evaluated
        if cand == b or not set(b.candidate_steps) <= set(allowed) or (
                b.knobs.specctl_only and not cand.knobs.specctl_only):
            return cand, score
        evaluated += 2
        if whole(cand) >= whole(b) * (1 + KEEP_MARGIN) or not holds_as_well(b, cand):
            return cand, score
        return b, _bucket_score(base, b.min_batch_size, runs, cost, graphs)

    win, win_score = best_off, off_score
    if on_score > off_score * (1 + BACKOFF_MARGIN):
        win, win_score = best_on, on_score
    elif on_score > -math.inf:
        evaluated += 2 * len(runs.runs)
        if _guard_prefers(worst(best_on), worst(best_off), on_score, off_score):
            win, win_score = best_on, on_score
    sglang, sglang_score = kept(*simplest(best_off, off_score))  # SGLang's own best under the same rules
    if win is best_off:
        return sglang, sglang_score, sglang, sglang_score, evaluated
    return (*kept(*simplest(win, win_score)), sglang, sglang_score, evaluated)


def _finish(cfg: AdaptiveConfig, runs: Runs, cost: CostModel, graphs: Sequence[int],
            fixed: Mapping[int, Prediction], best_k: int) -> tuple[AdaptiveConfig, int, Prediction]:
    """Pick the initial steps of a whole config (any step of the union, validate's rule); fall back to the
    best fixed step should the config lose to it."""
    best_init, best_pred = cfg.default_initial_steps, None
    for init in cfg.union_steps:
        pred = replay(cfg, runs, cost, initial_steps=init, graph_batch_sizes=graphs)
        if best_pred is None or pred.tokens_per_s > best_pred.tokens_per_s * (1 + 1e-9):
            best_init, best_pred = init, pred
    assert best_pred is not None
    if best_pred.tokens_per_s < fixed[best_k].tokens_per_s:
        # Per-bucket searches start each bucket at its middle candidate; should the chosen initial steps
        # make the whole config lose to a fixed step, the fixed step (in every bucket) is the answer.
        cfg = AdaptiveConfig(tuple(replace(b, candidate_steps=(best_k,), knobs=b.knobs.sglang)
                                   for b in cfg.buckets))
        best_init, best_pred = best_k, replay(cfg, runs, cost, initial_steps=best_k, graph_batch_sizes=graphs)
    return cfg, best_init, best_pred


def tune(setup: TuneSetup, records: Sequence[TraceRecord], cost: CostModel,
         progress: Callable[[str], None] | None = None, requests: Sequence[RequestRecord] = ()) -> TuneResult:
    """Search candidate sets and knobs per bucket for the highest predicted tokens/s (module docstring).
    `progress` gets a line as each bucket's search starts and ends (a long trace takes tens of seconds).
    `requests`: the trace's request lines as written, whose decode times give the serving overhead of a
    trace without verify timings (`request_overhead`)."""
    records = [r for r in records if r.accepted]
    if not records:
        raise UsageError("the trace has no non-empty verify records: nothing to tune on")
    # The serving time the trace measured beyond the cost model (`ServingOverhead`): the search and every
    # prediction run on served prices (the settled verifies' scale, the draft's pass over a joining prompt
    # at steps > 0); the loop's turn (a factor) and a per-token constant (joins) change no ranking, only
    # the ratios, so they are added to what is reported (`add`).
    ovh = None if setup.decode_only else serving_overhead(records, cost)
    if ovh is not None:
        cost = ovh.served(cost)
    depth = trace_depth(records)
    if ovh is None and not setup.decode_only and requests:
        adaptive_run = any(r.adaptive for r in requests)
        recorded = setup.cfg if adaptive_run else fixed_config(depth)
        ovh = request_overhead(requests, [r for r in records if r.from_requests], cost, recorded,
                               setup.initial_steps if adaptive_run else depth)
    allowed = tuple(s for s in cost.steps if s <= depth and (setup.steps is None or s in setup.steps))
    if not allowed:
        raise UsageError(f"the cost model measures steps {list(cost.steps)}, none <= the trace's depth {depth}")
    graphs = setup.graph_batch_sizes
    cur = setup.cfg
    by_bucket: dict[int, list[TraceRecord]] = {b.min_batch_size: [] for b in cur.buckets}
    for r in records:
        by_bucket[_route_key(cur, r.batch_size, graphs)].append(r)

    evaluated = 0
    chosen: list[Bucket] = []
    chosen_sglang: list[Bucket] = []
    for i, b in enumerate(cur.buckets):
        if len(by_bucket[b.min_batch_size]) < MIN_BUCKET_RECORDS:
            # (almost) no evidence for this bucket: keep what the user wrote (minus what SGLang cannot run)
            plain = replace(b, knobs=b.knobs.sglang)
            chosen.append(plain if setup.sglang else b)
            chosen_sglang.append(plain)
            continue
        # the whole runs that reach this bucket, replayed with the buckets chosen so far and the rest as written
        touched = {r.run for r in by_bucket[b.min_batch_size]}
        recs = [r for r in records if r.run in touched]
        runs = Runs.of(recs)
        base = replace(cur, buckets=(*chosen, *cur.buckets[i:]), strategy="ema")
        if progress is not None:
            progress(f"bucket {b.min_batch_size}: searching candidate sets and knobs over {len(recs)} verifies "
                     f"of {len(touched)} run(s)")
        best, score, best_sglang, _, n = _search_bucket(base, b, runs, cost, graphs, allowed, not setup.sglang)
        if progress is not None:
            progress(f"bucket {b.min_batch_size}: steps {list(best.candidate_steps)}, {score:.0f} tok/s at its batch "
                     f"sizes, decode at profiled prices ({n} configs replayed)")
        evaluated += n
        chosen.append(best)
        chosen_sglang.append(best_sglang)

    whole = Runs.of(records)
    current = replay(cur, whole, cost, initial_steps=setup.initial_steps, graph_batch_sizes=graphs)
    fixed = {k: replay(fixed_config(k), whole, cost, initial_steps=k) for k in allowed}
    best_k = max(fixed, key=lambda k: (fixed[k].tokens_per_s, -k))
    rec_cfg, best_init, best_pred = _finish(AdaptiveConfig(tuple(chosen), strategy="ema"), whole, cost, graphs,
                                            fixed, best_k)
    sglang_choice = None
    if rec_cfg.specctl_only:
        s_cfg, s_init, s_pred = _finish(AdaptiveConfig(tuple(chosen_sglang), strategy="ema"), whole, cost, graphs,
                                        fixed, best_k)
        drop_knob = s_pred.tokens_per_s * (1 + BACKOFF_MARGIN) >= best_pred.tokens_per_s
        if drop_knob and _guard_prefers(_worst_run_ratio(rec_cfg, whole, cost, graphs, lambda _b: True, best_init),
                                        _worst_run_ratio(s_cfg, whole, cost, graphs, lambda _b: True, s_init),
                                        best_pred.tokens_per_s, s_pred.tokens_per_s):
            drop_knob = False  # the guard: SGLang's config would lose a recorded run (see GUARD_RATIO)
        if drop_knob:
            # Across buckets (and with the initial steps) the knob did not pay after all: SGLang's config wins.
            rec_cfg, best_init, best_pred = s_cfg, s_init, s_pred
        else:
            sglang_choice = SGLangChoice(s_cfg, s_init, s_pred)
    none = fixed[0] if 0 in fixed else replay(fixed_config(0), whole, cost, initial_steps=0)

    def add(p: Prediction) -> Prediction:
        return p if ovh is None else replace(p, overhead_s_per_token=ovh.per_token, decode_scale=1.0 + ovh.turn)

    best_pred, current, none = add(best_pred), add(current), add(none)
    fixed = {k: add(v) for k, v in fixed.items()}
    if sglang_choice is not None:
        sglang_choice = replace(sglang_choice, predicted=add(sglang_choice.predicted))
    breakdown = per_run(rec_cfg, best_init, whole, cost, graphs, allowed, add)
    if progress is not None:
        progress(f"intervals: replaying the recommendation, steps {best_k} and no speculation on {BOOTSTRAP} "
                 "resamples of the trace's requests")
    intervals = speedup_intervals(rec_cfg, best_init, best_k, whole, cost, graphs, add)
    findings, coverage = validate_recommendation(rec_cfg, best_init, setup)
    return TuneResult(rec_cfg, best_init, best_pred, current, best_k, fixed[best_k], none, allowed, coverage,
                      tuple(findings), evaluated, sglang_choice, setup.sglang, ovh, breakdown, intervals,
                      trace_notes(records, depth, cost), cost.provenance(), cost.estimate is not None)


def validate_recommendation(
    cfg: AdaptiveConfig, initial_steps: int, setup: TuneSetup
) -> tuple[list[Finding], StepCoverage]:
    """Re-parse the recommendation as SGLang JSON (as a deployment block when it uses a specctl-only knob)
    and run step coverage on it, as `validate` would."""
    if cfg.specctl_only:
        parsed, findings = parse_deployment_adaptive(deployment_adaptive(cfg))
    else:
        parsed, findings = parse_sglang_config(sglang_json(cfg))
    if parsed is None or parsed.buckets != tuple(replace(b, key=str(b.min_batch_size), path=p.path)
                                                 for b, p in zip(cfg.buckets, parsed.buckets, strict=True)):
        raise AssertionError(f"tune produced a config that does not round-trip: {findings}")
    coverage, more = step_coverage(parsed, initial_steps=initial_steps, graph_batch_sizes=setup.graph_batch_sizes,
                                   max_batch_size=setup.max_batch_size)
    return findings + more, coverage
