"""What a traced run spent beyond the cost model's price of its verifies (`ServingOverhead`), from the
verify timings (`serving_overhead`) or from request lines (`request_overhead`). Torch-free.
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from dataclasses import dataclass

from specctl.adaptive.cost import CostModel
from specctl.adaptive.replay import replay
from specctl.adaptive.trace import RequestRecord, TraceRecord
from specctl.schemas.adaptive import (
    AdaptiveConfig,
)

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

