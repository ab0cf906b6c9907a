"""`specctl adaptive tune` on synthetic traces whose optimum is known, and its CLI.

The cost model is synthetic too (a verify of k drafts costs 1 + 0.15 k plain steps), so the right
answer can be worked out by hand: always-right drafter -> the largest step; never-right -> 0 (no
speculation); a trace that alternates long always-right and never-right phases -> an adaptive set that
follows the phases and beats every fixed step; a short never-right run beside a long always-right one ->
the zero_backoff that keeps that run within 5% of no speculation (the guard), not the config 1% faster
overall that loses it 8%.
"""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from specctl.adaptive.cost import CostModel
from specctl.adaptive.overhead import serving_overhead
from specctl.adaptive.replay import (
    Runs,
    Unanswerable,
    fixed_config,
    replay,
    replay_positions,
    resample_requests,
    trace_depth,
)
from specctl.adaptive.report import TuneResult, sglang_json
from specctl.adaptive.search import GUARD_COST, GUARD_RATIO, TuneSetup, _worst_run_ratio, tune
from specctl.adaptive.trace import TraceRecord, parse_record, read_trace
from specctl.errors import UsageError
from specctl.schemas.adaptive import AdaptiveConfig, parse_sglang_config

ENV = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}  # no hub, ever: every child
K = 7


def cost_model(per_draft: float = 0.15) -> CostModel:
    return CostModel({b: {k: 0.001 * b ** 0.5 * (1 + per_draft * k) for k in range(K + 1)} for b in (1, 2, 4, 8)})


def records(accepted: list[int], batch: int = 1) -> list[TraceRecord]:
    return [TraceRecord(line=i + 1, batch_size=batch, accepted=(a,) * batch, steps=K, drafted=(K,) * batch,
                        trace_steps=K) for i, a in enumerate(accepted)]


def setup(cfg: dict | None = None) -> TuneSetup:
    parsed, findings = parse_sglang_config(cfg or {"1": {"candidate_steps": [1, 3, 5]}})
    assert parsed is not None and not [f for f in findings if f.severity == "error"]
    return TuneSetup(parsed, initial_steps=3, max_batch_size=8)


def test_always_right_recommends_the_largest_step():
    res = tune(setup(), records([K] * 300), cost_model())
    assert res.recommended.bucket(1).candidate_steps[-1] == K
    assert res.predicted.batches_per_steps.get(K, 0) >= 0.9 * 300
    assert res.best_fixed_steps == K
    assert res.speedups()["vs_none"] > 2.5  # 8 tokens for 2.05 steps' cost
    assert res.speedups()["vs_best_fixed"] >= 0.99


def test_never_right_recommends_no_speculation():
    res = tune(setup(), records([0] * 300), cost_model())
    assert res.predicted.batches_per_steps.get(0, 0) >= 0.95 * 300
    assert res.best_fixed_steps == 0
    assert res.speedups()["vs_none"] >= 0.999
    # the user's config (1, 3, 5 without a 0) pays for every draft
    assert res.speedups()["vs_current"] > 1.1


def test_phase_change_picks_an_adaptive_set_that_follows_it():
    phases = ([K] * 150 + [0] * 150) * 3
    res = tune(setup(), records(phases), cost_model())
    cands = res.recommended.bucket(1).candidate_steps
    assert len(cands) >= 2 and min(cands) <= 1 and max(cands) >= 5, cands
    # it follows the phases: beats the best fixed step clearly, and runs both ends
    assert res.speedups()["vs_best_fixed"] > 1.1, res.to_json()
    used = res.predicted.batches_per_steps
    assert used.get(min(cands), 0) > 100 and used.get(max(cands), 0) > 100


def test_a_run_whose_traffic_wants_another_step_keeps_the_set(monkeypatch: pytest.MonkeyPatch):
    """One config for two kinds of traffic at batch 8: a short run the drafter always gets right (best: 7) and
    a long one of text it gets 1-3 of right (best: 2). A set that follows each predicts under SET_MARGIN above
    the long run's step alone, so the margin alone picks steps 2 and leaves the short run at 0.59x its best
    fixed step; a run below REGRET_RATIO x its own best, kept above it by the set, keeps the set."""
    import specctl.adaptive.search as search_module

    rng = random.Random(0)
    deep = [replace(r, run="code") for r in records([K] * 20, batch=8)]
    text = [replace(r, run="text", line=r.line + 1000)
            for r in records([rng.choice([1, 2, 2, 3]) for _ in range(600)], batch=8)]
    s = setup({"1": {"candidate_steps": [1, 3, 5]}, "8": {"candidate_steps": [1, 3, 5]}})
    res = tune(s, deep + text, cost_model())
    assert len(res.recommended.bucket(8).candidate_steps) > 1
    assert min(r.vs_best_fixed for r in res.runs) >= 0.95, [r.to_json() for r in res.runs]
    monkeypatch.setattr(search_module, "REGRET_RATIO", 0.0)  # the margin alone
    alone = tune(s, deep + text, cost_model())
    assert alone.recommended.bucket(8).candidate_steps == (2,)
    assert min(r.vs_best_fixed for r in alone.runs) < 0.6
    assert alone.predicted.tokens_per_s <= res.predicted.tokens_per_s * (1 + 1e-9)


def test_a_runs_drain_in_a_smaller_bucket_is_not_its_traffic():
    """Bucket 1 serves a long batch-1 run the drafter always gets right (best: 7) and the drain of a batch-8 run
    of text it gets 2-3 of right (30 verifies at batch 2). Steps 7 alone leaves that tail below REGRET_RATIO x
    its best, and a set that follows it predicts under SET_MARGIN more; the tail is not traffic of bucket 1:
    only runs a bucket serves at their full width count against its best single step, so bucket 1 keeps 7
    alone (counting the tail, it took {3, 4, 7}). The batch-8 run still counts in bucket 8."""
    rng = random.Random(1)
    deep = [replace(r, run="code") for r in records([K] * 1000)]
    body = records([rng.choice([1, 2]) for _ in range(200)], batch=8)
    tail = [replace(r, line=r.line + 200) for r in records([rng.choice([2, 3]) for _ in range(30)], batch=2)]
    text = [replace(r, run="text", line=r.line + 5000) for r in body + tail]
    s = setup({"1": {"candidate_steps": [1, 3, 5]}, "8": {"candidate_steps": [1, 3, 5]}})
    res = tune(s, deep + text, cost_model())
    assert res.recommended.bucket(1).candidate_steps == (K,), res.recommended.bucket(1)
    assert res.recommended.bucket(8).candidate_steps in ((1,), (2,), (3,)), res.recommended.bucket(8)


def timed(accepted: list[int], step_s: float, gap_s: float, run: str = "r", t0: float = 1000.0,
          rids: list[tuple[int, ...]] | None = None, join_gap_s: float = 0.0) -> list[TraceRecord]:
    """Engine-shaped records: each verify takes step_s (draft + verify) and gap_s passes before the next
    (gap_s + join_gap_s before a verify with a request new to the run, when `rids` are given)."""
    out, t, seen = [], t0, set()
    for i, a in enumerate(accepted):
        ids = rids[i] if rids is not None else None
        joined = ids is not None and not seen.issuperset(ids)
        seen.update(ids or ())
        t += gap_s + step_s + (join_gap_s if joined and i else 0.0)
        out.append(TraceRecord(line=i + 1, batch_size=1, accepted=(a,), steps=K, drafted=(K,), trace_steps=K,
                               time=t, draft_s=step_s / 4, verify_s=3 * step_s / 4, run=run, rids=ids))
    return out


def test_serving_overhead_is_a_turn_share_plus_joins_per_token_and_a_factor_on_the_price():
    cost = cost_model()
    price = cost.step_time(1, K)  # what the cost model says one traced verify costs
    recs = timed([2] * 50, step_s=price, gap_s=0.003)  # 3 tokens per verify, verifies as profiled
    got = serving_overhead(recs, cost)
    assert got.turn == pytest.approx(0.003 / price) and got.per_token == pytest.approx(0.0, abs=1e-12)
    assert got.scale == pytest.approx(1.0) and got.excess == pytest.approx(0.0, abs=1e-12)
    assert got.factor == pytest.approx(1.0 + 0.003 / price)
    # a second run (another engine) counts on its own; an idle pause is not serving time
    other = timed([0] * 20, step_s=price, gap_s=0.001, run="s", t0=5000.0)
    idle = timed([2] * 10, step_s=price, gap_s=0.003, t0=recs[-1].time + 30.0)
    got = serving_overhead(recs + other + idle, cost)
    assert got.turn == pytest.approx((49 * 0.003 + 19 * 0.001 + 9 * 0.003) / ((49 + 19 + 9) * price))
    # requests joining (a prefill, a KV import) take longer than the loop's turn: that excess is per token,
    # the same work in every config; the turn is the steady verifies' gaps over their time
    rids = [(i // 10,) for i in range(50)]  # a new request every 10 verifies: 4 joins after the first verify
    joins = serving_overhead(timed([2] * 50, step_s=price, gap_s=0.002, rids=rids, join_gap_s=0.006), cost)
    assert joins.turn == pytest.approx(0.002 / price)
    assert joins.per_token == pytest.approx(4 * 0.006 / (49 * 3))
    # verifies slower than profiled (a machine shared with prefill, router, clients): a factor on the price
    slow = serving_overhead(timed([2] * 50, step_s=1.5 * price, gap_s=0.0), cost)
    assert slow.turn == pytest.approx(0.0, abs=1e-9) and slow.scale == pytest.approx(1.5) == slow.factor
    assert slow.excess == pytest.approx(0.5 * price / 3) and slow.per_token == pytest.approx(0.0, abs=1e-9)
    fast = serving_overhead(timed([2] * 50, step_s=price / 2, gap_s=0.0), cost)
    assert fast.scale == pytest.approx(0.5) and fast.excess < 0  # profiled on a busier machine
    assert serving_overhead(records([2] * 10), cost) is None  # an older trace: no timings


def test_tune_adds_the_serving_overhead_to_every_prediction():
    price = cost_model().step_time(1, K)
    recs = timed([K] * 300, step_s=1.25 * price, gap_s=0.004)  # 8 tokens per verify
    with_ovh = tune(setup(), recs, cost_model())
    decode = tune(TuneSetup(setup().cfg, 3, max_batch_size=8, decode_only=True), recs, cost_model())
    assert decode.overhead is None and with_ovh.overhead is not None
    assert with_ovh.overhead.turn == pytest.approx(0.004 / (1.25 * price))
    assert with_ovh.overhead.scale == pytest.approx(1.25)
    assert with_ovh.recommended == decode.recommended  # always right: the largest step either way
    for a, b in ((with_ovh.predicted, decode.predicted), (with_ovh.none, decode.none)):
        # the same decode at 1.25x its price with the turn (4 ms a 1.25x step) on top
        assert 1 / a.tokens_per_s == pytest.approx((1.25 + 0.004 / price) / b.tokens_per_s)
    # no request joined: nothing per token, so a factor on every step leaves the ratios as decode has them
    assert with_ovh.speedups()["vs_none"] == pytest.approx(decode.speedups()["vs_none"])
    doc = with_ovh.to_json()
    assert doc["serving_overhead_s_per_token"] == pytest.approx(0.0, abs=1e-12)
    assert doc["serving_overhead"]["turn_share"] == pytest.approx(0.004 / (1.25 * price))
    assert doc["serving_overhead"]["verify_scale"] == pytest.approx(1.25)
    assert doc["serving_overhead"]["served_step_factor"] == pytest.approx(1.25 + 0.004 / price)


def test_the_draft_pass_over_a_joining_prompt_is_charged_to_speculation_not_plain_decoding():
    """A speculating PD decode server runs its draft model over every joining request's prompt (prefill filled
    the target's cache, not the draft's): served tiny-pd drafted more at a verify where a request joined, which
    plain decoding never runs (benchmarks/RESULTS.md). In the one scale
    over all verifies it priced plain decoding too, and `tune_confirm` over-predicted what `bench --ab`
    measured. Worked by hand: settled verifies at 1.2x their price, 3 ms more drafting a
    join; no speculation is then 1.2 x the plain step per token, speculation pays the pass at each join."""
    cost = cost_model()
    price = cost.step_time(1, K)
    recs, t = [], 1000.0
    for i in range(60):  # a request joins every 10 verifies, no gaps (no turn, nothing between)
        draft = 0.3 * price + (3e-3 if i % 10 == 0 else 0.0)
        t += draft + 0.9 * price
        recs.append(TraceRecord(line=i + 1, batch_size=1, accepted=(3,), steps=K, drafted=(K,), trace_steps=K,
                                time=t, draft_s=draft, verify_s=0.9 * price, run="r", rids=(i // 10,)))
    ovh = serving_overhead(recs, cost)
    assert ovh is not None and ovh.turn == pytest.approx(0.0, abs=1e-9)
    assert ovh.settled_scale == pytest.approx(1.2) and ovh.join_draft_s == pytest.approx(3e-3)
    assert ovh.scale == pytest.approx(1.2 + 6 * 3e-3 / (60 * price))  # all verifies: the passes in
    served = ovh.served(cost)
    assert served.step_time(1, 0) == pytest.approx(1.2 * cost.step_time(1, 0))
    assert served.step_time(1, K) == pytest.approx(1.2 * price)
    assert served.refill_time(1, K) == pytest.approx(3e-3) and served.refill_time(1, 0) == 0.0
    res = tune(setup(), recs, cost)
    assert res.none.tokens_per_s == pytest.approx(1 / (1.2 * cost.step_time(1, 0)))
    # steps K pays the pass at each of the 6 requests' first verifies, beyond the same replay without it
    fixed = replay(fixed_config(K), Runs.of(recs), served, initial_steps=K)
    bare = replay(fixed_config(K), Runs.of(recs), cost.served(1.2), initial_steps=K)
    assert fixed.verifies == bare.verifies and fixed.seconds - bare.seconds == pytest.approx(6 * 3e-3)
    doc = res.to_json()["serving_overhead"]
    assert doc["settled_scale"] == pytest.approx(1.2) and doc["join_draft_s"] == pytest.approx(3e-3)
    # a cost model that measured its own refill (a colocated profile: the pass is in it) takes none from the trace
    refilled = CostModel(cost.step_s, refill_s={b: {k: 1e-4 for k in row} for b, row in cost.step_s.items()})
    got = serving_overhead(recs, refilled)
    assert got is not None and got.join_draft_s == 0.0
    assert got.served(refilled).refill_time(1, 0) == pytest.approx(1e-4 * got.settled_scale)


def test_a_turn_that_follows_the_steps_time_prices_plain_decoding_from_a_deep_trace():
    # Served tiny-pd measured the loop's turn between verifies at about the same share of the verify's time
    # whether it drafted 0, 3 or 7 (benchmarks/RESULTS.md), the served steps at a factor of their price.
    # A trace drafting K on such a machine (1.3x, turn 12%) must predict what a plain run there takes:
    # 1.3 x 1.12 x the plain step's price per token at batch 1. Charging every step the deep trace's mean
    # turn instead prices the plain step at 1.3x plus 12% of a K-step (~5 plain steps here): speed-ups
    # over-predicted.
    rng = random.Random(5)
    acc = []
    for _ in range(400):  # a drafter right 3 times in 4 (geometric runs)
        a = 0
        while a < K and rng.random() < 0.75:
            a += 1
        acc.append(a)
    cost = cost_model(per_draft=0.6)
    step = 1.3 * cost.step_time(1, K)
    served = tune(setup(), timed(acc, step_s=step, gap_s=0.12 * step), cost)
    bare = tune(TuneSetup(setup().cfg, 3, max_batch_size=8, decode_only=True), timed(acc, step, 0.12 * step), cost)
    assert served.none.tokens_per_s == pytest.approx(1 / (1.3 * 1.12 * cost.step_time(1, 0)))
    assert served.speedups()["vs_none"] == pytest.approx(bare.speedups()["vs_none"])
    # a factor changes no choice
    assert served.recommended == bare.recommended and served.best_fixed_steps == bare.best_fixed_steps


def test_recommendation_validates_and_round_trips_as_sglang_json():
    res = tune(setup({"1": {"candidate_steps": [1, 3]}, "4": {"candidate_steps": [0, 1]}}),
               records([K] * 100) + records([0] * 100, batch=4), cost_model())
    assert not [f for f in res.findings if f.severity == "error"]
    assert not [f for f in res.findings if f.code == "ADP218"]  # no oscillating hysteresis band
    for b in res.recommended.buckets:
        assert b.knobs.down_hysteresis <= b.knobs.up_hysteresis
    assert set(res.recommended.union_steps) <= set(res.coverage.required_states)
    assert res.initial_steps in res.recommended.union_steps
    parsed, findings = parse_sglang_config(json.loads(json.dumps(res.sglang_json())))
    assert parsed == parse_sglang_config(sglang_json(res.recommended))[0]
    assert res.recommended.bucket(4).candidate_steps == (0,) or res.predicted.batches_per_steps.get(0, 0) >= 90


def test_candidates_never_exceed_the_trace_depth():
    shallow = [TraceRecord(line=i, batch_size=1, accepted=(3,), steps=3, drafted=(3,), trace_steps=3)
               for i in range(200)]
    assert trace_depth(shallow) == 3
    res = tune(setup(), shallow, cost_model())
    assert max(res.recommended.union_steps) <= 3
    assert res.predicted.lower_bound_verifies == 0
    # replaying deeper than the trace is flagged as a lower bound
    assert replay(fixed_config(5), shallow, cost_model(), initial_steps=5).lower_bound_verifies == 200


def test_an_acceptance_only_trace_is_refused_with_a_hint():
    old = [TraceRecord(line=1, batch_size=2, accepted=(1, 2))]
    with pytest.raises(UsageError, match="records no steps") as exc:
        tune(setup(), old, cost_model())
    assert "--trace-steps" in str(exc.value.hint)


def test_replay_counts_tokens_and_costs_exactly():
    cm = cost_model()
    recs = records([2, 7, 0])
    p = replay(fixed_config(3), recs, cm, initial_steps=3)
    assert p.tokens == (2 + 1) + (3 + 1) + (0 + 1)
    assert p.seconds == pytest.approx(3 * cm.step_time(1, 3))
    assert replay(fixed_config(0), recs, cm, initial_steps=0).tokens == 3


def test_positional_replay_follows_each_request():
    # rid 0 drafts 4 each verify: accepted 2 (L = 2, 1, 0 at positions 0..2), then 1 at 3, then 4 (all) at 5
    recs = [TraceRecord(line=1, batch_size=1, accepted=(2,), drafted=(4,), rids=(0,)),
            TraceRecord(line=2, batch_size=1, accepted=(1,), drafted=(4,), rids=(0,)),
            TraceRecord(line=3, batch_size=1, accepted=(4,), drafted=(4,), rids=(0,))]
    # 10 tokens emitted by verifies; at steps 1: p0 min(2,1)=1 -> p2 L=0 -> p3 L=1 -> p5 >=4 -> p7 >=2 -> p9 cap 0
    assert replay_positions(recs, 1) == {0: [1, 0, 1, 1, 1, 0]}
    with pytest.raises(Unanswerable):
        replay_positions(recs[:2] + [TraceRecord(line=3, batch_size=1, accepted=(1,), drafted=(1,), rids=(0,)),
                                     TraceRecord(line=4, batch_size=1, accepted=(0,), drafted=(4,), rids=(0,))], 2)


def test_cost_model_round_trips_and_interpolates():
    cm = cost_model()
    again = CostModel.from_json(json.loads(json.dumps(cm.to_json())))
    assert again.step_s == cm.step_s
    mid = again.step_time(3, 2)
    assert cm.step_time(2, 2) < mid < cm.step_time(4, 2)
    with pytest.raises(UsageError):
        CostModel.from_json({"kind": "nope"})
    with pytest.raises(UsageError):
        CostModel.from_json({"kind": "specctl-cost-model", "step_s": {"1": {"0": -1}}})


def test_a_step_between_two_measured_ones_is_priced_on_the_line_between_them():
    # `adaptive profile --steps 0,1,3,5,7`, the odd grid; a trace drafting 7 every step still holds verifies that
    # drafted 6 (a request's max_tokens cap), which the serving overhead and every replay must price
    full = cost_model().step_s
    odd = CostModel({b: {k: t for k, t in row.items() if k in (0, 1, 3, 5, 7)} for b, row in full.items()})
    assert odd.steps == (0, 1, 3, 5, 7)
    for b in (1, 3, 8):  # measured batch sizes and one between them
        assert odd.step_time(b, 6) == pytest.approx((odd.step_time(b, 5) + odd.step_time(b, 7)) / 2)
        assert odd.step_time(b, 2) == pytest.approx((odd.step_time(b, 1) + odd.step_time(b, 3)) / 2)
    # the full model is linear in steps, so the line through the odd ones is exact
    assert odd.step_time(4, 6) == pytest.approx(cost_model().step_time(4, 6))
    with pytest.raises(UsageError, match="no measurement for steps 8"):
        odd.step_time(1, 8)  # above every measured step: not extrapolated
    capped = records([K] * 100 + [0] * 100)
    capped[50] = replace(capped[50], accepted=(6,), drafted=(6,))
    res = tune(setup(), capped, odd)
    assert set(res.recommended.union_steps) <= {0, 1, 3, 5, 7}  # it proposes only steps the profile measured


def test_a_bucket_keeps_what_the_user_wrote_unless_the_change_predicts_better():
    # every step costs the same and the drafter is right 3 times, then wrong: steps 3 to 7 all emit 4 tokens a
    # verify at the same price, a tie the replay cannot split
    trace = records([3] * 300)
    flat = cost_model(per_draft=0.0)
    res = tune(setup({"1": {"candidate_steps": [5]}}), trace, flat)
    assert res.recommended.buckets[0].candidate_steps == (5,)  # the user's, not the tie's first ([3])
    assert res.predicted.tokens_per_s == pytest.approx(res.current.tokens_per_s)
    # a change that pays is still made: steps 1 emits 2 tokens a verify where 3-7 emit 4
    res = tune(setup({"1": {"candidate_steps": [1]}}), trace, flat)
    assert res.recommended.buckets[0].candidate_steps[0] >= 3
    assert res.predicted.tokens_per_s > 1.9 * res.current.tokens_per_s


def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "specctl.cli", *args], capture_output=True, text=True, timeout=120,
                          env=ENV)


def test_tune_cli_prints_json_and_text(tmp_path: Path):
    trace = tmp_path / "t.jsonl"
    trace.write_text("".join(json.dumps(r.to_json()) + "\n" for r in records(([K] * 60 + [0] * 60) * 2)))
    assert read_trace(trace)[0].trace_steps == K
    cost = tmp_path / "cost.json"
    cost.write_text(json.dumps(cost_model().to_json()))
    cfg = tmp_path / "adaptive.json"
    cfg.write_text(json.dumps({"1": {"candidate_steps": [1, 3, 5]}}))
    r = _cli("adaptive", "tune", str(cfg), "--trace", str(trace), "--cost", str(cost), "--format", "json")
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    # with zero_backoff the recommendation is a specctl deployment block; SGLang's best is then beside it
    rec = out["recommended"]["sglang_adaptive_config"] or out["sglang"]["sglang_adaptive_config"]
    cfg2, findings = parse_sglang_config(rec)
    assert isinstance(cfg2, AdaptiveConfig) and not [f for f in findings if f.severity == "error"]
    assert out["speedup"]["vs_best_fixed"] >= 1.0
    assert "candidate_steps" in out["recommended"]["deployment_snippet"]
    # progress goes to stderr, a line as each bucket's search starts and ends; stdout stays the JSON alone
    assert "tune: bucket 1: searching" in r.stderr and "configs replayed" in r.stderr
    r = _cli("adaptive", "tune", str(cfg), "--trace", str(trace), "--cost", str(cost))
    assert r.returncode == 0 and "speed-up:" in r.stdout and "valid: no error findings" in r.stdout
    # a bad cost file is a usage error (exit 2), never a traceback
    bad = tmp_path / "bad.json"
    bad.write_text("{}")
    r = _cli("adaptive", "tune", str(cfg), "--trace", str(trace), "--cost", str(bad))
    assert r.returncode == 2 and "Traceback" not in r.stderr and "cost model" in r.stderr


def test_tune_and_trace_modules_do_not_import_torch():
    code = ("import sys; import specctl.adaptive.search, specctl.adaptive.trace, specctl.cli.adaptive; "
            "print('torch' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, env=ENV)
    assert out.returncode == 0 and out.stdout.strip() == "False", out.stderr


def test_profile_writes_a_cost_model_tune_reads(tmp_path: Path):
    """`adaptive profile` on the builtin colocated preset: every (batch size, steps) point measured, in the
    file `tune` reads. (Whether 3 drafts cost more than none is a benchmark's question: with the fused draft
    chain and the small-row kernel a 3-draft step at batch 1 is ~1.2x a plain one, and one round of 3
    wall-clock steps on a shared machine cannot order that reliably.)"""
    out = tmp_path / "cost.json"
    r = _cli("adaptive", "profile", "-c", "tiny-colocated", "--batch-sizes", "1,2", "--steps", "0,3",
             "--rounds", "1", "--iters", "3", "--threads", "1", "-o", str(out))
    assert r.returncode == 0, r.stderr
    cm = CostModel.from_json(json.loads(out.read_text()))
    assert cm.batch_sizes == (1, 2) and cm.steps == (0, 3)
    assert all(cm.step_time(b, k) > 0 for b in (1, 2) for k in (0, 3))
    assert json.loads(out.read_text())["threads"] == 1
    assert json.loads(out.read_text())["clock"] == "wall"
    assert json.loads(out.read_text())["prompt_tokens"] > 10  # the built-in prompt
    r = _cli("adaptive", "profile", "-c", "tiny-colocated", "--batch-sizes", "1", "--steps", "0,2",
             "--rounds", "1", "--iters", "2", "--threads", "1", "--prompt-tokens", "200", "-o", str(out))
    assert r.returncode == 0, r.stderr
    assert json.loads(out.read_text())["prompt_tokens"] == 200
    # a colocated role measures the refill of a join; a PD decode role prefills nothing itself: none
    assert CostModel.from_json(json.loads(out.read_text())).refill_s is not None
    r = _cli("adaptive", "profile", "-c", "tiny-pd", "--batch-sizes", "1", "--steps", "0,2",
             "--rounds", "1", "--iters", "2", "--threads", "1", "-o", str(out))
    assert r.returncode == 0, r.stderr
    doc = json.loads(out.read_text())
    assert CostModel.from_json(doc).refill_s is None and "refill_steps" not in doc and "joins" not in r.stderr
    r = _cli("adaptive", "profile", "-c", "tiny-colocated", "--batch-sizes", "99")
    assert r.returncode == 2 and "max_batch_size" in r.stderr


def test_profile_on_the_cpu_clock(tmp_path: Path):
    """`--clock cpu` times steps with the process's CPU time (robust on a shared machine): every point is
    measured, the model says which clock it used, and an unknown clock is a usage error."""
    out = tmp_path / "cost.json"
    r = _cli("adaptive", "profile", "-c", "tiny-colocated", "--batch-sizes", "1", "--steps", "0,3",
             "--rounds", "1", "--iters", "3", "--threads", "1", "--clock", "cpu", "--sampled-temperature", "1.0",
             "-o", str(out))
    assert r.returncode == 0, r.stderr
    doc = json.loads(out.read_text())
    cm = CostModel.from_json(doc)
    assert doc["clock"] == "cpu" and cm.step_time(1, 3) > 0 and cm.step_time(1, 0) > 0
    # the sampled table is measured at every point too (whether sampling costs more than greedy is a few
    # percent, a benchmark's question: on a shared machine one round of 3 steps cannot order it reliably)
    assert doc["sampled_temperature"] == 1.0 and cm.sampled_step_s is not None
    assert cm.step_time(1, 3, sampled=1) > 0 and cm.step_time(1, 0, sampled=1) > 0
    # each point's refill (the steps after a request joins, beyond settled ones), in both tables
    assert cm.refill_s is not None and cm.sampled_refill_s is not None
    assert set(cm.refill_s[1]) == set(cm.sampled_refill_s[1]) == {0, 3} and doc["refill_steps"] > 0
    assert CostModel.from_json(cm.to_json()) == cm
    r = _cli("adaptive", "profile", "-c", "tiny-colocated", "--clock", "sundial")
    assert r.returncode == 2 and "--clock" in r.stderr


def test_profile_rounds_interleave_batch_sizes_and_steps(monkeypatch: pytest.MonkeyPatch):
    """Each round of `profile_costs` measures every (batch size, steps) point once, so a slow phase of a shared
    machine lands on every batch size alike, not on the one measured then. Recorded from the real engine: the
    steps each point pins and the requests it adds (a PD decode role: no turnover, so b requests a point)."""
    from specctl.cli.adaptive import _engine_config
    from specctl.engine.engine import Engine
    from specctl.engine.speculative.decoder import SpeculativeDecoder
    from specctl.engine.speculative.profile import profile_costs

    points: list[list[int]] = []  # [steps, requests added]
    pin, add = SpeculativeDecoder.pin_steps, Engine.add_request

    def pinned(self: SpeculativeDecoder, k: int) -> None:
        points.append([k, 0])
        pin(self, k)

    def added(self: Engine, *a: object, **kw: object) -> object:
        points[-1][1] += 1
        return add(self, *a, **kw)  # type: ignore[arg-type]

    monkeypatch.setattr(SpeculativeDecoder, "pin_steps", pinned)
    monkeypatch.setattr(Engine, "add_request", added)
    cfg, role = _engine_config("tiny-pd", [])
    assert role == "decode"
    cm = profile_costs(cfg, [1, 2], [0, 2], rounds=2, iters=1, refill=False)
    assert [tuple(p) for p in points if p[1]] == [(0, 1), (2, 1), (0, 2), (2, 2)] * 2
    assert cm.batch_sizes == (1, 2) and cm.steps == (0, 2)


def test_profile_rounds_interleave_the_greedy_and_sampled_tables(monkeypatch: pytest.MonkeyPatch):
    """With a sampled table, every round measures both tables (the first to go alternating), so a slow phase
    prices greedy and sampled steps alike: one table after the other, four profiles priced a sampled plain
    step 8-16% below a greedy one. Recorded from the real engine: each point's steps and its requests'
    temperature."""
    from specctl.cli.adaptive import _engine_config
    from specctl.engine.engine import Engine
    from specctl.engine.speculative.decoder import SpeculativeDecoder
    from specctl.engine.speculative.profile import profile_costs

    points: list[tuple[int, float]] = []  # (steps, temperature of the point's requests)
    pin, add = SpeculativeDecoder.pin_steps, Engine.add_request
    pinned_steps: list[int] = []

    def pinned(self: SpeculativeDecoder, k: int) -> None:
        pinned_steps.append(k)
        pin(self, k)

    def added(self: Engine, prompt: object, params: Any, *a: object, **kw: object) -> object:
        point = (pinned_steps[-1], float(params.temperature))
        if not points or points[-1] != point:
            points.append(point)
        return add(self, prompt, params, *a, **kw)  # type: ignore[arg-type]

    monkeypatch.setattr(SpeculativeDecoder, "pin_steps", pinned)
    monkeypatch.setattr(Engine, "add_request", added)
    cfg, _ = _engine_config("tiny-pd", [])
    cm = profile_costs(cfg, [1], [0, 2], rounds=2, iters=1, sampled_temperature=0.7, refill=False)
    greedy, sampled = [(0, 0.0), (2, 0.0)], [(0, 0.7), (2, 0.7)]
    assert points == greedy + sampled + sampled + greedy
    assert cm.sampled_step_s is not None and set(cm.sampled_step_s[1]) == set(cm.step_s[1]) == {0, 2}


def test_sampled_share_prices_each_verify():
    """A cost model with a sampled table prices a verify by the share of its requests that sample, and a
    trace record carrying `sampled` is replayed at that price; without the table, greedy prices everything."""
    greedy = {b: {0: 1e-3 * b, 3: 2e-3 * b} for b in (1, 4)}
    sampled = {b: {0: 1.1e-3 * b, 3: 3e-3 * b} for b in (1, 4)}
    cm = CostModel(greedy, {}, sampled)
    assert cm.step_time(4, 3, sampled=0) == pytest.approx(8e-3)
    assert cm.step_time(4, 3, sampled=2) == pytest.approx(10e-3)
    assert cm.step_time(4, 3, sampled=4) == pytest.approx(12e-3)
    assert CostModel(greedy).step_time(4, 3, sampled=4) == pytest.approx(8e-3)
    recs = [parse_record({"batch_size": 4, "accepted": [1, 1, 1, 1], "steps": 3, "sampled": 2}, "t", 1)]
    p = replay(fixed_config(3), recs, cm, initial_steps=3)
    assert p.seconds == pytest.approx(10e-3)
    with pytest.raises(UsageError, match="sampled = 5 exceeds"):
        parse_record({"batch_size": 4, "accepted": [1, 1, 1, 1], "sampled": 5}, "t", 1)
    bad = {**cm.to_json(), "sampled_step_s": {"1": {"0": 1e-3}}}
    with pytest.raises(UsageError, match="same"):
        CostModel.from_json(bad)


def turnover_trace() -> list[TraceRecord]:
    """A traced closed loop of width 2 at steps K: requests 0 and 2 accept every draft, 1 and 3 none, 16
    tokens each (the engine never drafts past max_tokens). Replayed at steps 0 the requests finish in pairs
    (joins before steps 1 and 17: 2); at steps K request 0 is done in 2 verifies, 2 joins, is done in 2 more
    while 1 crawls, 3 joins (joins before steps 1, 3 and 5: 3)."""
    n = 16
    accepts = {0: True, 1: False, 2: True, 3: False}
    pending, active, pos, recs = [2, 3], [0, 1], dict.fromkeys(accepts, 0), []
    while active:
        drafted = [min(K, n - 1 - pos[r]) for r in active]
        acc = [d if accepts[r] else 0 for r, d in zip(active, drafted, strict=True)]
        recs.append(TraceRecord(line=len(recs) + 1, batch_size=len(active), accepted=tuple(acc), steps=K,
                                drafted=tuple(drafted), trace_steps=K, rids=tuple(active)))
        for r, a in zip(active, acc, strict=True):
            pos[r] += a + 1
        active = [r for r in active if pos[r] < n]
        while pending and len(active) < 2:
            active.append(pending.pop(0))
    return recs


def test_a_step_after_requests_join_pays_the_refill():
    """`CostModel.refill_s` (what the steps after a prefill pay to refill the cache, `adaptive profile`) is
    added once at every replayed step that follows requests joining: a plain run's equal requests finish
    and are replaced together, a speculating run's one by one. Cost models without it price no refill."""
    recs = turnover_trace()
    plain = {b: {k: 1e-3 * (1 + 0.2 * k) for k in range(K + 1)} for b in (1, 2)}
    refill = {b: dict.fromkeys(range(K + 1), 0.01) for b in (1, 2)}
    bare, full = CostModel(plain), CostModel(plain, refill_s=refill)
    assert bare.refill_time(2, 3) == 0.0 and full.refill_time(2, 3) == pytest.approx(0.01)
    for k, joins in ((0, 2), (K, 3)):
        without = replay(fixed_config(k), recs, bare, initial_steps=k)
        with_refill = replay(fixed_config(k), recs, full, initial_steps=k)
        assert with_refill.tokens == without.tokens == 4 * 16
        assert with_refill.seconds - without.seconds == pytest.approx(joins * 0.01)
    # the traced run's own price counts a refill at each verify with a request new to it (rids 0+1, 2, 3)
    t, timed_recs = 1000.0, []
    for rec in recs:
        t += 0.005
        timed_recs.append(replace(rec, time=t, draft_s=0.001, verify_s=0.002))
    price = sum(bare.step_time(r.batch_size, max(r.drafted or (0,))) for r in timed_recs)
    got, got_bare = serving_overhead(timed_recs, full), serving_overhead(timed_recs, bare)
    assert got is not None and got_bare is not None
    assert got_bare.scale == pytest.approx(0.003 * len(recs) / price)
    assert got.scale == pytest.approx(0.003 * len(recs) / (price + 3 * 0.01))


def test_cost_model_refill_tables_round_trip_and_are_checked():
    cm = CostModel({1: {0: 1e-3, 3: 2e-3}}, {}, {1: {0: 1.1e-3, 3: 3e-3}}, {1: {0: 0.0, 3: 1e-3}},
                   {1: {0: 5e-4, 3: 2e-3}})
    again = CostModel.from_json(json.loads(json.dumps(cm.to_json())))
    assert again == cm
    assert again.refill_time(1, 3, sampled=0) == pytest.approx(1e-3)
    assert again.refill_time(1, 3, sampled=1) == pytest.approx(2e-3)  # the sampled table, as step_time mixes
    doc = cm.to_json()
    with pytest.raises(UsageError, match="refill_s must measure the same"):
        CostModel.from_json({**doc, "refill_s": {"1": {"0": 0.0}}})
    with pytest.raises(UsageError, match="refill_s.1.3"):
        CostModel.from_json({**doc, "refill_s": {"1": {"0": 0.0, "3": -1e-3}}})
    old = {k: v for k, v in doc.items() if "refill" not in k}  # a cost model from before refills: none priced
    assert CostModel.from_json(old).refill_time(1, 3) == 0.0


def test_each_run_of_a_trace_replays_with_a_fresh_policy():
    """Two engines' runs in one trace (`run`): each is replayed from the policy's start, so the whole equals
    the two replayed apart; without run ids the second would inherit the first's EMA and steps."""
    from dataclasses import replace as dc_replace

    cfg, _ = parse_sglang_config({"1": {"candidate_steps": [0, 1, 3, 7], "warmup_batches": 2, "update_interval": 2}})
    assert cfg is not None
    bad = [dc_replace(r, run="a") for r in records([0] * 60)]
    good = [dc_replace(r, run="b", line=r.line + 60) for r in records([K] * 60)]
    cm = cost_model()
    both = replay(cfg, bad + good, cm, initial_steps=3)
    apart = [replay(cfg, part, cm, initial_steps=3) for part in (bad, good)]
    assert both.tokens == sum(p.tokens for p in apart)
    assert both.seconds == pytest.approx(sum(p.seconds for p in apart))
    assert both.switches == sum(p.switches for p in apart)
    inherited = replay(cfg, [dc_replace(r, run=None) for r in bad + good], cm, initial_steps=3)
    assert inherited.tokens != both.tokens  # the fresh start matters here: the useless run left the bucket at 0
    # the run id survives the trace format
    line = json.dumps(good[0].to_json())
    assert parse_record(json.loads(line), "t", 1).run == "b"


def test_a_phase_of_useless_drafts_is_kept_within_5pct_of_no_speculation(monkeypatch):
    """A trace of a long always-right run and a short never-right one: the best config without zero_backoff
    keeps probing the never-right run and loses it 8% against no speculation. The guard takes the back-off
    instead (the run within 5%, at most 2% of the whole given up), and without the guard tune does not."""
    code = [replace(r, run="code") for r in records([K] * 600)]
    never = [replace(r, run="never", line=r.line + 600) for r in records([0] * 100)]
    recs = code + never
    cfg = setup({"1": {"candidate_steps": [0, 1, 3, 5, 7]}})

    def worst(res: TuneResult) -> float:
        return _worst_run_ratio(res.recommended, Runs.of(recs), cost_model(), (), lambda _b: True, res.initial_steps)

    guarded = tune(cfg, recs, cost_model())
    assert guarded.recommended.bucket(1).knobs.zero_backoff > 1
    assert worst(guarded) >= GUARD_RATIO
    monkeypatch.setattr("specctl.adaptive.search.GUARD_RATIO", 0.0)
    unguarded = tune(cfg, recs, cost_model())
    assert unguarded.recommended.bucket(1).knobs.zero_backoff == 1 and worst(unguarded) < 0.95
    assert guarded.predicted.tokens_per_s >= unguarded.predicted.tokens_per_s * (1 - GUARD_COST)


def test_a_set_must_beat_the_best_single_step_by_the_margin(monkeypatch):
    """A bucket keeps its best single step unless a set predicts SET_MARGIN better (a replay of one sampled
    draw rewards sets that fit its noise). The phase-change trace's set wins by >10%: with the margin above
    that, the bucket is the best fixed step; a never-right run the single step would lose is still kept."""
    phases = records(([K] * 150 + [0] * 150) * 3)
    assert len(tune(setup(), phases, cost_model()).recommended.bucket(1).candidate_steps) >= 2
    monkeypatch.setattr("specctl.adaptive.search.SET_MARGIN", 0.5)
    res = tune(setup({"1": {"candidate_steps": [1]}}), phases, cost_model())
    assert res.recommended.bucket(1).candidate_steps == (res.best_fixed_steps,), res.recommended
    assert res.speedups()["vs_best_fixed"] == pytest.approx(1.0)
    # ... but not in place of the user's own set, which the replay puts above that single step: the margin
    # guards against a set fitted to the trace's draw, and the user's was not fitted to it (`kept`)
    res = tune(setup(), phases, cost_model())
    assert res.recommended.bucket(1).candidate_steps == (1, 3, 5)
    assert res.speedups()["vs_best_fixed"] > 1.05
    # the guard's bar still holds: a step that loses the never-right run (below GUARD_RATIO) is not taken
    code = [replace(r, run="code") for r in records([K] * 600)]
    never = [replace(r, run="never", line=r.line + 600) for r in records([0] * 100)]
    recs = code + never
    kept = tune(setup({"1": {"candidate_steps": [0, 1, 3, 5, 7]}}), recs, cost_model())
    assert 0 in kept.recommended.bucket(1).candidate_steps and len(kept.recommended.bucket(1).candidate_steps) > 1
    worst = _worst_run_ratio(kept.recommended, Runs.of(recs), cost_model(), (), lambda _b: True, kept.initial_steps)
    assert worst >= GUARD_RATIO


def test_each_recorded_run_is_reported_against_its_own_best_fixed_step():
    """One config serves every run of a trace; `runs` replays each alone under it and under every fixed step,
    so a workload that a fixed step serves better shows, with by how much."""
    from specctl.adaptive.report import render_tune

    code = [replace(r, run="code") for r in records([K] * 300)]
    never = [replace(r, run="never", line=r.line + 300) for r in records([0] * 300)]
    res = tune(setup({"1": {"candidate_steps": [0, 1, 3, 5, 7]}}), code + never, cost_model())
    by = {r.run: r for r in res.runs}
    assert set(by) == {"code", "never"} and by["code"].verifies == by["never"].verifies == 300
    assert by["code"].best_fixed_steps == K and by["never"].best_fixed_steps == 0
    alone = replay(res.recommended, code, cost_model(), initial_steps=res.initial_steps)
    assert by["code"].recommended.tokens_per_s == pytest.approx(alone.tokens_per_s)
    # nothing beats the largest step on an always-right run, nor no speculation on a never-right one
    assert all(0 < r.vs_best_fixed <= 1 + 1e-9 for r in res.runs)
    assert [r["run"] for r in res.to_json()["runs"]] == ["code", "never"]
    text = render_tune(res)
    assert "per recorded run" in text and f"best fixed {K}:" in text and "best fixed 0:" in text


def requests_trace(per_request: list[list[int]]) -> list[TraceRecord]:
    """One request after another at batch 1 (rid i makes the verifies per_request[i]), drafting K each."""
    out: list[TraceRecord] = []
    for rid, accepted in enumerate(per_request):
        out += [TraceRecord(line=len(out) + 1, batch_size=1, accepted=(a,), steps=K, drafted=(K,), trace_steps=K,
                            rids=(rid,)) for a in accepted]
    return out


def test_speedup_intervals_come_from_resampling_the_requests():
    same = requests_trace([[K] * 20 for _ in range(12)])  # every request alike: every resample is the trace
    res = tune(setup(), same, cost_model())
    assert res.intervals is not None
    for key, (lo, hi) in res.intervals.items():
        assert lo == pytest.approx(hi) == pytest.approx(res.speedups()[key]), key
    # half the requests always right, half never: which ones a resample holds moves the prediction
    mixed = requests_trace([[K] * 20 if i % 2 else [0] * 60 for i in range(12)])
    res = tune(setup(), mixed, cost_model())
    assert res.intervals is not None
    lo, hi = res.intervals["vs_none"]
    assert lo < res.speedups()["vs_none"] < hi and hi - lo > 0.05
    doc = res.to_json()
    assert doc["speedup_ci95"]["vs_none"] == [lo, hi]
    from specctl.adaptive.report import render_tune

    assert f"no speculation [{lo:.2f}, {hi:.2f}] (95% intervals" in " ".join(render_tune(res).split())
    # a replicate draws as many requests per run, with replacement, from that run only
    runs = Runs.of(mixed)
    rep = resample_requests(runs, random.Random(1))
    assert rep is not None and len(rep.runs) == 1
    facts = rep.runs[0][1]
    assert facts is not None and len(facts.total) == 12 and set(facts.total.values()) <= {160, 60}
    # a trace without rids (an older one) is replayed verify for verify: no intervals
    assert tune(setup(), records([K] * 100), cost_model()).intervals is None
