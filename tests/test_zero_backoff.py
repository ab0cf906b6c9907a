"""`zero_backoff`, specctl's opt-in back-off at steps 0: policy, config, validate, export, tune.

With SGLang's semantics a bucket at steps 0 probes the next candidate at every decision, so a drafter
that is never right runs half its batches at the probe step. With `zero_backoff: N` each failed probe
doubles the next stay at 0 (1, 2, 4, ... N decision intervals) and a probe that holds resets it. Off (1,
the default) it is SGLang's policy exactly; SGLang itself ignores the key, which validate, export and tune
make impossible to miss. Oracles: hand-derived switch sequences, SGLang's own `AdaptiveSpeculativeParams`
(in a child process; the test process never imports sglang), and the tuner's cost-model arithmetic.
"""

from __future__ import annotations

import json
import random
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest
from policy_support import ENV, FAST, deployment_cfg, needs_sglang, sglang_steps
from policy_support import policy_steps as run
from policy_support import validate_tiny_pd as _validate
from typer.testing import CliRunner

from specctl.adaptive.cost import CostModel
from specctl.adaptive.policy import AdaptivePolicy
from specctl.adaptive.replay import fixed_config, replay
from specctl.adaptive.report import TuneResult, sglang_json
from specctl.adaptive.search import TuneSetup, tune
from specctl.adaptive.trace import TraceRecord
from specctl.cli.main import app
from specctl.schemas.adaptive import AdaptiveConfig, parse_deployment_adaptive, parse_sglang_config

runner = CliRunner()
K = 7


def runs(seq: list[int]) -> list[tuple[bool, int]]:
    """Run lengths: (at steps 0?, consecutive batches)."""
    out: list[tuple[bool, int]] = []
    for s in seq:
        z = s == 0
        if out and out[-1][0] == z:
            out[-1] = (z, out[-1][1] + 1)
        else:
            out.append((z, 1))
    return out


# -- policy --------------------------------------------------------------------------------------------


def test_off_is_sglangs_probe_every_decision() -> None:
    # SGLang's rule by hand: at 3 with EMA 0 drop to 0 (0 <= 0.25), probe 1 at the next decision, drop again.
    expected = [3, 0, 1, 0, 1, 0, 1, 0]
    assert run(deployment_cfg([0, 1, 3], **FAST), [0] * 8, initial=3) == expected
    assert run(deployment_cfg([0, 1, 3], zero_backoff=1, **FAST), [0] * 8, initial=3) == expected


def test_off_equals_the_default_on_random_streams() -> None:
    rng = random.Random(13)
    for _ in range(40):
        cands = sorted({0, *rng.sample(range(1, 6), rng.randint(0, 3))})
        knobs = {"ema_alpha": rng.choice([0.2, 0.5, 1.0]), "warmup_batches": rng.randint(0, 3),
                 "update_interval": rng.randint(1, 4), "down_hysteresis": rng.choice([-0.25, 0.0])}
        stream = [rng.choice([0, 0, 1, 5]) for _ in range(120)]
        init = rng.choice(cands)
        a = AdaptivePolicy(deployment_cfg(cands, **knobs), initial_steps=init, clock=lambda: 0.0)
        b = AdaptivePolicy(deployment_cfg(cands, zero_backoff=1, **knobs), initial_steps=init, clock=lambda: 0.0)
        for x in stream:
            assert a.on_verify_complete([x], 1) == b.on_verify_complete([x], 1)
            assert a.snapshot() == b.snapshot()


def test_each_failed_probe_doubles_the_stay_at_zero_up_to_the_cap() -> None:
    # Hand-derived with ema_alpha 1, a decision every batch: drop 1 -> 0 (not a probe: stay 1), probe,
    # fail (stay 2), hold, probe, fail (stay 4), hold x3, probe, fail (stay min(8, 4) = 4), ...
    got = run(deployment_cfg([0, 1], zero_backoff=4, **FAST), [0] * 21, initial=1)
    assert got == [1, 0, 1, 0, 0, 1, 0, 0, 0, 0, 1, 0, 0, 0, 0, 1, 0, 0, 0, 0, 1]


def test_never_right_drafter_runs_geometrically_fewer_probes() -> None:
    # SGLang's default knobs: warm-up 10, a decision every 5 batches, alpha 0.2.
    n = 2000
    off = run(deployment_cfg([0, 1, 3]), [0] * n, initial=3)
    on = run(deployment_cfg([0, 1, 3], zero_backoff=16), [0] * n, initial=3)
    # the first 15 batches run the initial 3 (warm-up + one interval), then 0 / probe alternate
    assert runs(off)[0] == runs(on)[0] == (False, 15)
    assert {r for r in runs(off)[1:-1]} == {(True, 5), (False, 5)}  # SGLang: half the batches probe
    zero_runs = [length for z, length in runs(on) if z]
    probe_runs = [length for z, length in runs(on)[1:] if not z]
    assert zero_runs[:6] == [5, 10, 20, 40, 80, 80] and set(zero_runs[4:-1]) == {80}
    assert set(probe_runs) == {5}
    frac_on = sum(s > 0 for s in on) / n
    assert sum(s > 0 for s in off) / n > 0.49
    assert frac_on <= 0.15, frac_on
    assert sum(s > 0 for s in on[n // 2:]) / (n // 2) <= 1 / 17 + 0.01  # the cap's steady state: 1 in 17


def test_a_drafter_that_becomes_right_again_is_found_within_the_cap() -> None:
    cap, interval = 16, 5
    stream = [0] * 1000 + [K] * 300 + [0] * 100
    got = run(deployment_cfg([0, 1, 3], zero_backoff=cap), stream, initial=3, counterfactual=True)
    assert got[999] == 0
    back = next(i for i in range(1000, len(got)) if got[i] > 0) - 1000
    assert back <= cap * interval, back  # at most one full stay at the cap
    top = next(i for i in range(1000, len(got)) if got[i] == 3) - 1000
    assert top <= back + 2 * interval  # the probe holds and climbs at the next decision
    assert all(s == 3 for s in got[1000 + top:1300])
    # the probe held, so the back-off was reset: the next never-right phase stays at 0 only 1 interval first
    tail = runs(got[1300:])
    assert tail[0][0] is False and tail[1] == (True, interval), tail


def test_snapshot_shows_the_stay_only_when_the_knob_is_on() -> None:
    p = AdaptivePolicy(deployment_cfg([0, 1], zero_backoff=4, **FAST), initial_steps=1)
    for _ in range(4):
        p.on_verify_complete([0], 1)
    assert p.snapshot()["buckets"]["1"]["zero_stay"] == 2
    q = AdaptivePolicy(deployment_cfg([0, 1], **FAST), initial_steps=1)
    assert "zero_stay" not in q.snapshot()["buckets"]["1"]


def test_the_engine_runs_the_back_off_and_still_decodes_greedily(tmp_path: Path) -> None:
    """The builtin engine (deployment knob -> EngineConfig -> decoder policy) with a drafter that is always
    wrong: the hand-derived sequence of the policy test above, and plain greedy's output."""
    from spec_support import (  # isort: skip
        ScriptedDrafter, always_wrong, engine_config, greedy, plain_outputs, spec_engine, write_models,
    )

    target = write_models(tmp_path)["target"]
    prompt = list(b"prompt 0: ")
    (want,) = plain_outputs(target, [prompt], [22])
    spec = {"algorithm": "ngram", "num_steps": 1,
            "adaptive": {**FAST, "zero_backoff": 4, "buckets": {"1": {"candidate_steps": [0, 1]}}}}
    engine, dec = spec_engine(engine_config(target, spec), ScriptedDrafter({tuple(prompt): want}, always_wrong))
    rid = engine.add_request(prompt, greedy(22))
    steps: list[int] = []
    out: list[int] | None = None
    while out is None:
        before = dec.stats()["verify_batches"]
        for seq in engine.step():
            if seq.rid == rid and seq.is_finished:
                out = list(seq.output_ids)
        if dec.stats()["verify_batches"] > before:
            steps.append(dec.last_state.steps)
    assert out == want
    assert steps == [1, 0, 1, 0, 0, 1, 0, 0, 0, 0, 1, 0, 0, 0, 0, 1, 0, 0, 0, 0, 1]
    assert dec.stats()["buckets"]["1"]["zero_stay"] == 4


# -- SGLang's own policy ignores the key ---------------------------------------------------------------

@needs_sglang
def test_sglang_runs_a_file_with_the_knob_as_if_it_were_absent(tmp_path: Path) -> None:
    obj = {"zero_backoff": 16, "warmup_batches": 2, "update_interval": 2,
           "1": {"candidate_steps": [0, 1, 3], "zero_backoff": 8}}
    stream = [0] * 150 + [3] * 30 + [0] * 60
    sglang_ran = sglang_steps(obj, tmp_path, stream, initial=3)
    # specctl reads the SGLang file as SGLang does (warning ADP220), and zero_backoff 1 is SGLang's policy
    cfg, findings = parse_sglang_config(obj)
    assert cfg is not None and {f.code for f in findings} == {"ADP220"}
    assert run(cfg, stream, initial=3) == sglang_ran
    plain = {k: v for k, v in obj.items() if k != "zero_backoff"}
    plain["1"] = {"candidate_steps": [0, 1, 3]}
    assert run(deployment_cfg([0, 1, 3], **{k: v for k, v in plain.items() if k != "1"}), stream,
               initial=3) == sglang_ran
    # the same knobs with the back-off on (a deployment, builtin engine) probe less than SGLang does
    on = run(deployment_cfg([0, 1, 3], zero_backoff=16, warmup_batches=2, update_interval=2), stream, initial=3)
    assert sum(s > 0 for s in on[:150]) < sum(s > 0 for s in sglang_ran[:150]) / 2


# -- config: parsing, validate, export ----------------------------------------------------------------


def test_deployment_knob_merges_and_bad_values_are_errors() -> None:
    cfg, findings = parse_deployment_adaptive(
        {"zero_backoff": 8, "buckets": {1: {"candidate_steps": [0, 1]}, 8: {"candidate_steps": [0, 1],
                                                                             "zero_backoff": 1}}})
    assert cfg is not None and not findings
    assert [b.knobs.zero_backoff for b in cfg.buckets] == [8, 1]
    assert cfg.specctl_only == ("zero_backoff",)
    assert deployment_cfg([0, 1]).specctl_only == ()
    for bad in (0, 2.5, True, "8"):
        _, findings = parse_deployment_adaptive({"zero_backoff": bad, "buckets": {1: {"candidate_steps": [0, 1]}}})
        assert [(f.code, f.severity, f.path) for f in findings] == [
            ("ADP214", "error", "$.speculative.adaptive.zero_backoff")], bad


def test_sglang_json_with_the_knob_warns_and_validate_names_it(tmp_path: Path) -> None:
    cfg, findings = parse_sglang_config({"zero_backoff": 16, "1": {"candidate_steps": [0, 1], "zero_backoff": 4}})
    assert cfg is not None and cfg.bucket(1).knobs.zero_backoff == 1  # what SGLang runs
    assert [(f.code, f.severity, f.path) for f in findings] == [("ADP220", "warning", "$.zero_backoff"),
                                                                ("ADP220", "warning", "$.1.zero_backoff")]
    assert "SGLang ignores" in findings[0].message and "deployment" in findings[0].fix
    path = tmp_path / "adaptive.json"
    path.write_text(json.dumps({"1": {"candidate_steps": [0, 1, 3], "zero_backoff": 4}}))
    res = runner.invoke(app, ["validate", str(path), "--initial-steps", "3", "--format", "json"])
    assert res.exit_code == 0, res.output
    (f,) = json.loads(res.stdout)["files"][0]["findings"]
    assert (f["code"], f["path"], f["line"]) == ("ADP220", "$.1.zero_backoff", 1)


def test_validate_refuses_the_knob_for_engine_sglang_only() -> None:
    rc, findings = _validate("engine=sglang", "speculative.adaptive.zero_backoff=16")
    assert rc == 1
    (f,) = findings
    assert (f["code"], f["severity"], f["path"]) == ("ADP221", "error", "$.speculative.adaptive.zero_backoff")
    assert "SGLang ignores" in f["message"] and "engine: builtin" in f["fix"] and "--sglang" in f["fix"]
    rc, findings = _validate("engine=sglang", "speculative.adaptive.buckets.4.zero_backoff=8")
    assert rc == 1 and [f["path"] for f in findings] == ["$.speculative.adaptive.buckets.4.zero_backoff"]
    role_block = "roles.decode.speculative.adaptive={zero_backoff: 8, buckets: {1: {candidate_steps: [0, 1]}}}"
    rc, findings = _validate("engine=sglang", "roles.decode.speculative.num_steps=1", role_block)
    assert rc == 1 and [f["path"] for f in findings] == ["$.roles.decode.speculative.adaptive.zero_backoff"]
    assert _validate("engine=sglang", "speculative.adaptive.zero_backoff=1") == (0, [])  # SGLang's behaviour
    assert _validate("engine=builtin", "speculative.adaptive.zero_backoff=16") == (0, [])
    assert _validate("speculative.adaptive.zero_backoff=16") == (0, [])  # builtin is the default
    rc, findings = _validate("speculative.adaptive.zero_backoff=0")
    assert rc == 1 and [f["code"] for f in findings] == ["SCH004"]
    res = runner.invoke(app, ["explain", "ADP221"])
    assert res.exit_code == 0 and "zero_backoff" in res.stdout


def test_export_sglang_refuses_the_knob_and_drops_its_default() -> None:
    res = subprocess.run([sys.executable, "-m", "specctl.cli", "export", "sglang", "-c", "tiny-pd", "--set",
                          "speculative.adaptive.buckets.4.zero_backoff=8"], capture_output=True, text=True,
                         timeout=60, env=ENV)
    assert res.returncode == 2 and "Traceback" not in res.stderr, res.stderr
    assert "speculative.adaptive.buckets.4.zero_backoff" in res.stderr and "SGLang" in res.stderr
    assert "--set speculative.adaptive.buckets.4.zero_backoff=1" in res.stderr
    res = subprocess.run([sys.executable, "-m", "specctl.cli", "export", "sglang", "-c", "tiny-pd", "--set",
                          "speculative.adaptive.zero_backoff=1", "--format", "json"], capture_output=True, text=True,
                         timeout=60, env=ENV)
    assert res.returncode == 0, res.stderr
    (text,) = json.loads(res.stdout)["files"].values()
    assert "zero_backoff" not in text and parse_sglang_config(json.loads(text))[1] == []


def test_simulate_replays_a_deployment_with_the_knob(tmp_path: Path) -> None:
    trace = tmp_path / "t.jsonl"
    trace.write_text("".join(json.dumps({"batch_size": 1, "accepted": [0]}) + "\n" for _ in range(400)))
    out = {}
    for zb in (1, 16):
        res = runner.invoke(app, ["adaptive", "simulate", "tiny-pd", "--trace", str(trace), "--set",
                                  "speculative.adaptive.buckets.1.candidate_steps=[0,1,3]", "--set",
                                  "speculative.num_steps=3", "--set",
                                  f"speculative.adaptive.zero_backoff={zb}", "--format", "json"])
        assert res.exit_code == 0, res.output
        out[zb] = [json.loads(line)["steps"] for line in res.stdout.splitlines() if line.strip()]
    assert out[1] == run(deployment_cfg([0, 1, 3]), [0] * 400, initial=3)[1:] + [out[1][-1]]
    assert sum(s > 0 for s in out[16]) < sum(s > 0 for s in out[1]) / 2


# -- tune ----------------------------------------------------------------------------------------------


def cost_model() -> CostModel:
    # a verify of k drafts costs 1 + 0.4 k plain steps: 2 positions = 1.4x a plain step (a CPU's regime)
    return CostModel({b: {k: 0.001 * (1 + 0.4 * k) for k in range(K + 1)} for b in (1, 2, 4, 8)})


def records(accepted: list[int]) -> list[TraceRecord]:
    return [TraceRecord(line=i + 1, batch_size=1, accepted=(a,), steps=K, drafted=(K,), trace_steps=K)
            for i, a in enumerate(accepted)]


def tune_setup(*, sglang: bool = False) -> TuneSetup:
    cfg, _ = parse_sglang_config({"1": {"candidate_steps": [0, 1, 3]}})
    assert cfg is not None
    return TuneSetup(cfg, initial_steps=3, max_batch_size=8, sglang=sglang)


def vs_none(cfg: AdaptiveConfig, initial: int, recs: list[TraceRecord]) -> float:
    cm = cost_model()
    return replay(cfg, recs, cm, initial_steps=initial).tokens_per_s / replay(
        fixed_config(0), recs, cm, initial_steps=0).tokens_per_s


CODE_THEN_NEVER = [K] * 100 + [0] * 500  # a drafter that is right on code, then useless for long


@pytest.fixture(scope="module")
def tuned() -> TuneResult:
    return tune(tune_setup(), records(CODE_THEN_NEVER), cost_model())


def test_tune_turns_the_back_off_on_for_a_drafter_that_goes_useless(tuned: TuneResult) -> None:
    res = tuned
    (bucket,) = res.recommended.buckets
    assert bucket.knobs.zero_backoff > 1 and 0 in bucket.candidate_steps, bucket
    assert res.specctl_only == ("zero_backoff",)
    # the same config: a never-right drafter >= 0.95x no speculation once it has settled, code still pays
    assert vs_none(res.recommended, 0, records([0] * 3000)) >= 0.95
    assert vs_none(res.recommended, res.initial_steps, records([K] * 300)) >= 1.5
    # SGLang's semantics cannot: the best SGLang config probes every other interval (~1 / (0.5 + 0.5 * 1.4))
    assert res.sglang is not None and not res.sglang.cfg.specctl_only
    assert vs_none(res.sglang.cfg, 0, records([0] * 3000)) < 0.9
    assert res.predicted.tokens_per_s > res.sglang.predicted.tokens_per_s * 1.01
    # the SGLang JSON cannot express it: none is printed for the recommendation, the alternative is clean
    assert res.sglang_json() is None
    with pytest.raises(ValueError, match="zero_backoff"):
        sglang_json(res.recommended)
    out = res.to_json()
    assert out["recommended"]["sglang_adaptive_config"] is None
    assert out["recommended"]["deployment_adaptive"]["buckets"]["1"]["zero_backoff"] == bucket.knobs.zero_backoff
    assert "zero_backoff" in out["recommended"]["deployment_snippet"] and "SGLang" in out["recommended"]["sglang_note"]
    alt = out["sglang"]["sglang_adaptive_config"]
    assert "zero_backoff" not in json.dumps(alt) and parse_sglang_config(alt)[1] == []
    assert not [f for f in res.findings if f.severity == "error"]
    again, _ = parse_deployment_adaptive(out["recommended"]["deployment_adaptive"])
    assert again is not None and again.bucket(1).knobs == bucket.knobs


def test_tune_for_sglang_never_proposes_the_knob(tuned: TuneResult) -> None:
    res = tune(tune_setup(sglang=True), records(CODE_THEN_NEVER), cost_model())
    assert res.specctl_only == () and res.sglang is None and res.sglang_only
    assert all(b.knobs.zero_backoff == 1 for b in res.recommended.buckets)
    assert "zero_backoff" not in json.dumps(res.to_json()["recommended"])
    full = tuned
    assert full.sglang is not None
    # its own search finds the SGLang config at least as good as the alternative the full search names
    assert res.predicted.tokens_per_s >= full.sglang.predicted.tokens_per_s * 0.99


def test_tune_keeps_the_knob_off_when_it_does_not_pay() -> None:
    for trace in ([K] * 300, [0] * 300):
        res = tune(tune_setup(), records(trace), cost_model())
        assert res.specctl_only == () and res.sglang is None and res.sglang_json() is not None


def test_tune_cli_says_sglang_cannot_express_it_and_sglang_flag_restricts(tmp_path: Path) -> None:
    trace = tmp_path / "t.jsonl"
    trace.write_text("".join(json.dumps(r.to_json()) + "\n" for r in records(CODE_THEN_NEVER)))
    cost = tmp_path / "cost.json"
    cost.write_text(json.dumps(cost_model().to_json()))
    cfg = tmp_path / "adaptive.json"
    cfg.write_text(json.dumps({"1": {"candidate_steps": [0, 1, 3]}}))
    base = [sys.executable, "-m", "specctl.cli", "adaptive", "tune", "--trace", str(trace), "--cost", str(cost)]

    def cli(*args: str) -> str:
        r = subprocess.run([*base, *args], capture_output=True, text=True, timeout=120, env=ENV)
        assert r.returncode == 0, r.stderr
        return r.stdout

    text = cli(str(cfg))
    assert "SGLang cannot express" in text and "zero_backoff:" in text
    assert "best SGLang can run" in text
    out = json.loads(cli(str(cfg), "--format", "json"))
    assert out["recommended"]["sglang_adaptive_config"] is None and out["sglang"] is not None
    restricted = cli(str(cfg), "--sglang", "--format", "json")
    assert "zero_backoff" not in restricted and json.loads(restricted)["search"]["sglang_only"] is True
    # a deployment with engine: sglang restricts by itself
    dep = cli("tiny-pd", "--set", "engine=sglang", "--format", "json")
    assert "zero_backoff" not in dep and json.loads(dep)["search"]["sglang_only"] is True


def test_search_tries_the_back_off_only_where_0_is_a_candidate() -> None:
    # steps limited to 1..7: no set contains 0, so the knob is never proposed whatever the trace
    res = tune(replace(tune_setup(), steps=tuple(range(1, K + 1))), records(CODE_THEN_NEVER), cost_model())
    assert res.specctl_only == () and 0 not in res.recommended.union_steps
