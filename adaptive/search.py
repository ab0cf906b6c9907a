"""The adaptive-config search behind `specctl adaptive tune`.

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

Torch-free (it imports only the policy and the schemas), so it runs wherever `validate` runs.
"""

from __future__ import annotations

import functools
import itertools
import math
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, replace

from specctl.adaptive.cost import CostModel
from specctl.adaptive.overhead import request_overhead, serving_overhead
from specctl.adaptive.replay import Prediction, Runs, fixed_config, replay, trace_depth, trace_notes
from specctl.adaptive.report import SGLangChoice, TuneResult, deployment_adaptive, sglang_json
from specctl.adaptive.stats import BOOTSTRAP, per_run, speedup_intervals
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
MIN_BUCKET_RECORDS = 20  # fewer verifies than this in a bucket: too little evidence, keep the user's bucket


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
