"""`zero_threshold`, specctl's opt-in bar to steps 0: policy, config, validate, export, tune.

SGLang steps a bucket down from s to the candidate below, prev, while the EMA of accepted drafts is at or
below `prev - 0.5 + down_hysteresis`, and to 0 at `0.5 + down_hysteresis`: one hysteresis shifts every bar.
On an engine whose verify costs little more than a plain step, steps 7 with half its drafts accepted beats
steps 5, so the tuner wants a wide negative down_hysteresis, which also puts 0 out of reach of a drafter
that is never right. `zero_threshold` sets the bar to 0 on its own; unset it is SGLang's policy exactly.
Oracles: hand-derived step sequences, decision-for-decision equality with SGLang's bar written out, SGLang's
own `AdaptiveSpeculativeParams` (child process), and synthetic traces whose per-run best steps are known.
"""

from __future__ import annotations

import json
import random
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from policy_support import ENV, FAST, deployment_cfg, needs_sglang, policy_steps, sglang_steps
from policy_support import validate_tiny_pd as _validate
from typer.testing import CliRunner

from specctl.adaptive.cost import CostModel
from specctl.adaptive.policy import AdaptivePolicy
from specctl.adaptive.report import TuneResult
from specctl.adaptive.search import TuneSetup, tune
from specctl.adaptive.trace import TraceRecord
from specctl.schemas.adaptive import parse_deployment_adaptive, parse_sglang_config

runner = CliRunner()
K = 7
WIDE = {"down_hysteresis": -2.5, "up_hysteresis": -2.0}


# -- policy --------------------------------------------------------------------------------------------


def test_a_wide_band_holds_a_deep_step_and_only_the_knob_reaches_zero() -> None:
    # Hand-derived, EMA = the last batch, a decision every batch. Bars with down_hysteresis -2.5: 7 -> 5 at
    # <= 2.0, 5 -> 0 at <= 0.5 - 2.5 = -2.0, which no EMA reaches: a never-right drafter stays at 5.
    assert policy_steps(deployment_cfg([0, 5, 7], **FAST, **WIDE), [0] * 6, initial=7) == [7, 5, 5, 5, 5, 5]
    # With zero_threshold 0.5 the same decision walks on to 0, then probes 5 at every decision (SGLang's probe).
    cfg = deployment_cfg([0, 5, 7], zero_threshold=0.5, **FAST, **WIDE)
    assert policy_steps(cfg, [0] * 6, initial=7) == [7, 0, 5, 0, 5, 0]
    # 3 of 7 accepted: the wide band holds 7 (3 > 2.0), SGLang's default bars drop to 5 (3 <= 4.25) and stay
    assert policy_steps(cfg, [3] * 6, initial=7, counterfactual=True) == [7] * 6
    assert policy_steps(deployment_cfg([0, 5, 7], **FAST), [3] * 6, initial=7, counterfactual=True) == [7] + [5] * 5
    # 1 of 7: down to 5 (1 <= 2.0), and there 1 > 0.5 holds it
    assert policy_steps(cfg, [1] * 6, initial=7, counterfactual=True) == [7] + [5] * 5


def test_unset_null_and_sglangs_own_bar_written_out_decide_alike() -> None:
    """Decision for decision on random streams: the knob unset, null, and set to SGLang's 0.5 +
    down_hysteresis are one policy."""
    rng = random.Random(17)
    for _ in range(40):
        cands = sorted({0, *rng.sample(range(1, 8), rng.randint(1, 3))})
        knobs: dict[str, Any] = {"ema_alpha": rng.choice([0.2, 0.5, 1.0]), "warmup_batches": rng.randint(0, 3),
                                 "update_interval": rng.randint(1, 4),
                                 "down_hysteresis": rng.choice([-2.0, -0.25, 0.0])}
        knobs["up_hysteresis"] = max(knobs["down_hysteresis"], rng.choice([-1.5, 0.0]))
        stream = [rng.choice([0, 0, 1, 3, 7]) for _ in range(120)]
        init = rng.choice(cands)
        bar = 0.5 + knobs["down_hysteresis"]
        extras: list[dict[str, Any]] = [{}, {"zero_threshold": None}]
        if bar >= 0:  # a bar below 0 cannot be written (no EMA is below it; leave 0 out of the candidates)
            extras.append({"zero_threshold": bar})
        policies = [AdaptivePolicy(deployment_cfg(cands, **knobs, **extra), initial_steps=init, clock=lambda: 0.0)
                    for extra in extras]
        for x in stream:
            k = policies[0].steps_for_batch(1)
            assert {p.steps_for_batch(1) for p in policies} == {k}
            for p in policies:
                p.on_verify_complete([min(x, k)], 1)


@needs_sglang
def test_sglang_runs_a_file_with_the_knob_as_if_it_were_absent(tmp_path: Path) -> None:
    obj = {"zero_threshold": 0.5, "ema_alpha": 0.5, "warmup_batches": 2, "update_interval": 2, **WIDE,
           "1": {"candidate_steps": [0, 5, 7]}}
    stream = [3] * 40 + [0] * 80
    sglang_ran = sglang_steps(obj, tmp_path, stream, initial=7)
    cfg, findings = parse_sglang_config(obj)
    assert cfg is not None and [f.code for f in findings] == ["ADP220"]
    assert "0.5 + down_hysteresis" in findings[0].message
    assert policy_steps(cfg, stream, initial=7) == sglang_ran
    assert 0 not in sglang_ran[40:]  # SGLang never reaches 0 with this band
    knobs = {k: v for k, v in obj.items() if k != "1"}
    mine = policy_steps(deployment_cfg([0, 5, 7], **knobs), stream, initial=7)
    assert mine[:40] == sglang_ran[:40] and mine.count(0) > 20  # the builtin engine does


# -- config: parsing, validate, export ----------------------------------------------------------------


def test_deployment_knob_merges_and_bad_values_are_errors() -> None:
    cfg, findings = parse_deployment_adaptive(
        {"zero_threshold": 0.75, "buckets": {1: {"candidate_steps": [0, 5]}, 4: {"candidate_steps": [0, 1],
                                                                                "zero_threshold": None},
                                              8: {"candidate_steps": [0, 1], "zero_threshold": 0}}})
    assert cfg is not None and not findings, findings
    assert [b.knobs.zero_threshold for b in cfg.buckets] == [0.75, None, 0]
    assert [b.knobs.zero_bar for b in cfg.buckets] == [0.75, 0.25, 0]
    assert cfg.specctl_only == ("zero_threshold",) and cfg.bucket(4).knobs.specctl_only == ()
    for bad in (-0.5, "0.5", True, float("nan")):
        _, findings = parse_deployment_adaptive({"zero_threshold": bad, "buckets": {1: {"candidate_steps": [0, 1]}}})
        assert [(f.code, f.severity, f.path) for f in findings] == [
            ("ADP214", "error", "$.speculative.adaptive.zero_threshold")], bad


def test_validate_refuses_the_knob_for_engine_sglang_only() -> None:
    rc, findings = _validate("engine=sglang", "speculative.adaptive.buckets.4.zero_threshold=0.5")
    assert rc == 1
    (f,) = findings
    assert (f["code"], f["path"]) == ("ADP221", "$.speculative.adaptive.buckets.4.zero_threshold")
    assert "0.5 + down_hysteresis" in f["message"] and "engine: builtin" in f["fix"] and "set it to" not in f["fix"]
    assert _validate("engine=sglang", "speculative.adaptive.zero_threshold=null") == (0, [])  # SGLang's bar
    assert _validate("speculative.adaptive.zero_threshold=0.5") == (0, [])  # builtin is the default
    rc, findings = _validate("speculative.adaptive.zero_threshold=-1")
    assert rc == 1 and [f["code"] for f in findings] == ["SCH004"]


def test_export_sglang_refuses_the_knob() -> None:
    res = subprocess.run([sys.executable, "-m", "specctl.cli", "export", "sglang", "-c", "tiny-pd", "--set",
                          "speculative.adaptive.zero_threshold=0.5"], capture_output=True, text=True, timeout=60,
                         env=ENV)
    assert res.returncode == 2 and "Traceback" not in res.stderr, res.stderr
    assert "speculative.adaptive.zero_threshold: 0.5" in res.stderr and "0.5 + down_hysteresis" in res.stderr
    assert "=None" not in res.stderr and "remove it for SGLang" in res.stderr


# -- tune ----------------------------------------------------------------------------------------------


def cost_model() -> CostModel:
    # a verify of k drafts costs 1 + 0.15 k plain steps: speculating deep is cheap
    return CostModel({b: {k: 0.001 * (1 + 0.15 * k) for k in range(K + 1)} for b in (1, 2, 4, 8)})


def records(accepted: list[int], run: str, first_line: int) -> list[TraceRecord]:
    return [TraceRecord(line=first_line + i, batch_size=1, accepted=(a,), steps=K, drafted=(K,), trace_steps=K,
                        run=run) for i, a in enumerate(accepted)]


# Three engines' runs at batch 1, whose best fixed steps follow from the cost model (tokens per verify at k
# over 1 + 0.15 k): "deep" (7, 0, 7, 0, ...: EMA ~3.5 at 7) is best at 7; "middle" (4, 0, 0, 0: EMA ~1 at
# 7) at 4, where 7 would be slower than no speculation; "never" at 0. Holding 7 at EMA 3.5 needs the 7 -> 4
# bar below 3.1 (down_hysteresis < -0.4), reaching 0 from 4 needs 0.5 + down_hysteresis >= ~0: SGLang's bars
# leave no room; zero_threshold does.
THREE_RUNS = (records([K, 0] * 150, "deep", 1) + records([4, 0, 0, 0] * 75, "middle", 301)
              + records([0] * 300, "never", 601))


def tune_setup(*, sglang: bool = False) -> TuneSetup:
    cfg, _ = parse_sglang_config({"1": {"candidate_steps": [1, 3, 5]}})
    assert cfg is not None
    return TuneSetup(cfg, initial_steps=3, max_batch_size=8, sglang=sglang)


@pytest.fixture(scope="module")
def tuned() -> TuneResult:
    return tune(tune_setup(), THREE_RUNS, cost_model())


def test_tune_sets_the_bar_to_zero_where_sglangs_bars_cannot_serve_every_run(tuned: TuneResult) -> None:
    res = tuned
    (bucket,) = res.recommended.buckets
    assert {0, 4, K} <= set(bucket.candidate_steps) and bucket.knobs.zero_threshold is not None, bucket
    assert bucket.knobs.down_hysteresis < -0.4 and "zero_threshold" in res.specctl_only
    by = {r.run: r for r in res.runs}
    assert {r: by[r].best_fixed_steps for r in by} == {"deep": K, "middle": 4, "never": 0}
    assert by["deep"].vs_best_fixed >= 0.98 and by["middle"].vs_best_fixed >= 0.98, res.to_json()["runs"]
    assert by["never"].vs_best_fixed >= 0.9
    # the best config SGLang can run gives up one of the runs
    assert res.sglang is not None and not res.sglang.cfg.specctl_only
    assert res.predicted.tokens_per_s > res.sglang.predicted.tokens_per_s * 1.01
    out = res.to_json()
    assert out["recommended"]["sglang_adaptive_config"] is None
    assert out["recommended"]["deployment_adaptive"]["buckets"]["1"]["zero_threshold"] == bucket.knobs.zero_threshold
    again, findings = parse_deployment_adaptive(out["recommended"]["deployment_adaptive"])
    assert again is not None and again.bucket(1).knobs == bucket.knobs and not findings


def test_tune_for_sglang_never_proposes_the_knob(tuned: TuneResult) -> None:
    res = tune(tune_setup(sglang=True), THREE_RUNS, cost_model())
    assert res.specctl_only == () and all(b.knobs.zero_threshold is None for b in res.recommended.buckets)
    assert "zero_threshold" not in json.dumps(res.to_json()["recommended"])
    assert min(r.vs_best_fixed for r in res.runs) < 0.9  # what the knob was for
    assert tuned.sglang is not None
    assert res.predicted.tokens_per_s >= tuned.sglang.predicted.tokens_per_s * 0.99
