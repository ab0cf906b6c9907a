"""Counterfactual replay of a verify trace through the adaptive policy, against a cost model.

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

Torch-free (it imports only the policy and the schemas).
"""

from __future__ import annotations

import random
import zlib
from collections import Counter, deque
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, NamedTuple

from specctl.adaptive.cost import CostModel
from specctl.adaptive.policy import AdaptivePolicy
from specctl.adaptive.trace import TraceRecord
from specctl.errors import UsageError
from specctl.schemas.adaptive import (
    AdaptiveConfig,
    Bucket,
    Knobs,
)


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
