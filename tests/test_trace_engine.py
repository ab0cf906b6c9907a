"""Verify traces recorded by the real engine (builtin models), and the counterfactual they support.

- every verify batch becomes one line with consistent fields (accepted <= drafted <= steps, rids, times),
  one line per verify the decoder counted, and `adaptive simulate` still reads the file;
- `--trace-steps K` drafts K every step whatever the policy says;
- counterfactual exactness: a trace recorded at K = 7 replayed positionally at k = 1, 2, 3
  (`specctl.adaptive.tune.replay_positions`) gives exactly the accepted drafts per verify of a real run at
  fixed steps k, request by request, on builtin:tiny-hybrid drafted by builtin:tiny-draft (greedy);
- `serve --trace-out` reaches the engine config (through the environment, so launched roles get it).
"""

from __future__ import annotations

import dataclasses
import json
import subprocess
import sys
from pathlib import Path

import pytest

from specctl.adaptive.trace import TRACE_OUT_ENV, TRACE_STEPS_ENV, read_trace
from specctl.adaptive.tune import CostModel, Runs, Unanswerable, fixed_config, replay, replay_positions
from specctl.engine.config import EngineConfig
from specctl.engine.engine import Engine
from specctl.engine.sampling_params import SamplingParams
from specctl.errors import InvalidInput
from specctl.schemas.role_config import RoleConfig, SpeculativeConfig

PROMPTS = ["import os\nimport sys\n\n\ndef main(", "class Parser:\n    def __init__(self, ", "for i in range(10):\n"]
NEW_TOKENS = 40


def config(steps: int, algorithm: str = "draft", **kw: object) -> EngineConfig:
    spec: dict[str, object] = {"algorithm": "draft", "draft": "builtin:tiny-draft", "num_steps": steps}
    if algorithm == "ngram":
        spec = {"algorithm": "ngram", "num_steps": steps}
    return EngineConfig(model_ref="builtin:tiny-hybrid", device="cpu", max_batch_size=4, max_tokens=4096,
                        speculative=SpeculativeConfig.from_json(spec), **kw)  # type: ignore[arg-type]


def bound_only(runs: Runs) -> Runs:
    """`runs` with every unknown match counted as a miss (the replay's lower bound, before `_censored`)."""
    return Runs(tuple((recs, facts._replace(cont=0.0) if facts is not None else None) for recs, facts in runs.runs))


def run_one_at_a_time(cfg: EngineConfig) -> tuple[Engine, list[list[int]], list[list[int]]]:
    eng = Engine(cfg)
    params = SamplingParams(max_tokens=NEW_TOKENS, ignore_eos=True)
    results = [eng.generate(p, params)[0] for p in PROMPTS]  # batch 1: one request at a time
    return eng, [r.spec["accepted_per_step"] for r in results], [r.token_ids for r in results]


@pytest.fixture(scope="module", params=["draft", "ngram"])
def deep_trace(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> tuple[Path, list[list[int]], dict]:
    """A trace drafting 7 every step, by the draft model, or by prompt lookup (which proposes fewer where its
    match runs out, or nothing: the replay must take those limits from the trace)."""
    path = tmp_path_factory.mktemp("trace") / "verify.jsonl"
    eng, accepted, tokens = run_one_at_a_time(config(3, request.param, trace_out=str(path), trace_steps=7))
    stats = eng.stats()["speculative"]
    eng.decoder.trace.close()
    return path, tokens, stats | {"algorithm_under_test": request.param}


def test_trace_lines_are_complete_and_consistent(deep_trace):
    path, _, stats = deep_trace
    recs = read_trace(path)
    assert len(recs) == stats["verify_batches"] == stats["trace"]["records"]
    for r in recs:
        assert r.batch_size == len(r.accepted) == len(r.drafted) == len(r.rids) == 1
        assert r.steps == r.trace_steps == 7
        assert all(a <= d <= 7 for a, d in zip(r.accepted, r.drafted, strict=True))
        assert r.time is not None and r.draft_s is not None and r.verify_s is not None and r.verify_s > 0
        assert r.sampled == 0  # greedy requests
    assert sum(sum(r.accepted) for r in recs) == stats["accepted_tokens"]
    assert recs[0].run and {r.run for r in recs} == {recs[0].run}  # one engine, one run
    # the old reader's view (adaptive simulate) still loads it
    out = subprocess.run([sys.executable, "-m", "specctl.cli", "adaptive", "simulate", "tiny-colocated",
                          "--trace", str(path), "--format", "json"], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert len(out.stdout.splitlines()) == len(recs)


@pytest.mark.parametrize("k", [1, 2, 3, 5])
def test_counterfactual_replay_equals_a_real_run_at_fixed_steps(deep_trace, k):
    path, deep_tokens, stats = deep_trace
    eng, real_accepted, tokens = run_one_at_a_time(config(k, stats["algorithm_under_test"]))
    assert tokens == deep_tokens  # greedy: the same text whatever the steps
    recs = read_trace(path)
    replayed = replay_positions(recs, k, strict=False)
    # Exact wherever the trace determines it (it cannot right after a fully accepted K-draft verify, so a
    # request's replay may stop early): a prefix of the real run, covering a good part of it.
    covered = 0
    for rid, real in enumerate(real_accepted):
        got = replayed[rid]
        assert got == real[: len(got)], (rid, got, real)
        covered += len(got)
    assert covered >= max(10, 0.3 * sum(len(r) for r in real_accepted)), (covered, real_accepted)
    if covered == sum(len(r) for r in real_accepted):
        assert replay_positions(recs, k) == dict(enumerate(real_accepted))
    else:
        with pytest.raises(Unanswerable):
            replay_positions(recs, k)
    # tune's replay walks the same positions (the trace is one single-stream run): as many verifies and
    # tokens as the real run at k, where the trace determines them (estimated elsewhere: `_censored`); with the
    # unknown matches counted as misses (cont 0) it never undercounts the verifies
    cm = CostModel({1: {s: 1e-3 * (1 + 0.2 * s) for s in range(8)}})
    pred = replay(fixed_config(k), recs, cm, initial_steps=k)
    bound = replay(fixed_config(k), bound_only(Runs.of(recs)), cm, initial_steps=k)
    real_verifies = sum(len(r) for r in real_accepted)
    real_tokens = sum(a + 1 for r in real_accepted for a in r)
    if pred.lower_bound_verifies == 0:
        assert (pred.verifies, pred.tokens) == (real_verifies, real_tokens)
        assert (bound.verifies, bound.tokens) == (real_verifies, real_tokens)
    else:
        assert pred.tokens == bound.tokens == real_tokens and bound.verifies >= real_verifies


def test_trace_steps_needs_trace_out_and_env_reaches_the_config(monkeypatch):
    monkeypatch.setenv(TRACE_STEPS_ENV, "4")
    monkeypatch.delenv(TRACE_OUT_ENV, raising=False)
    role = {"model": {"target": "builtin:tiny-hybrid"}, "speculative": {"algorithm": "draft", "num_steps": 1}}
    with pytest.raises(InvalidInput, match="--trace-out"):
        EngineConfig.from_role(RoleConfig.from_json(role))
    monkeypatch.setenv(TRACE_OUT_ENV, "/tmp/x.jsonl")
    cfg = EngineConfig.from_role(RoleConfig.from_json(role))
    assert (cfg.trace_out, cfg.trace_steps, cfg.max_draft_tokens) == ("/tmp/x.jsonl", 4, 5)
    monkeypatch.setenv(TRACE_STEPS_ENV, "zero")
    with pytest.raises(InvalidInput, match="positive integer"):
        EngineConfig.from_role(RoleConfig.from_json(role))


def test_serve_refuses_trace_steps_without_trace_out():
    out = subprocess.run([sys.executable, "-m", "specctl.cli", "serve", "--role", "colocated", "-c", "tiny-colocated",
                          "--trace-steps", "3"], capture_output=True, text=True, timeout=120)
    assert out.returncode == 2 and "--trace-out" in out.stderr and "Traceback" not in out.stderr


def test_no_trace_without_the_option(tmp_path):
    eng, _, _ = run_one_at_a_time(dataclasses.replace(config(2)))
    assert eng.decoder.trace is None and "trace" not in eng.stats()["speculative"]
    assert json.dumps(eng.stats()["speculative"])  # still serialisable


def test_trace_counts_sampled_requests(tmp_path: Path):
    """`sampled` says how many of a verify batch's requests sample (tune prices them with the sampled table)."""
    path = tmp_path / "t.jsonl"
    eng = Engine(config(2, trace_out=str(path)))
    eng.generate(PROMPTS[:2], [SamplingParams(max_tokens=8, ignore_eos=True),
                               SamplingParams(max_tokens=8, ignore_eos=True, temperature=1.0, seed=1)])
    eng.decoder.trace.close()
    recs = read_trace(path)
    assert recs and all(r.sampled is not None and r.sampled <= 1 for r in recs)  # only one request samples
    assert any(r.batch_size == 2 and r.sampled == 1 for r in recs)


def run_together(cfg: EngineConfig) -> tuple[Engine, list[list[int]], list[list[int]]]:
    eng = Engine(cfg)
    params = SamplingParams(max_tokens=NEW_TOKENS, ignore_eos=True)
    results = eng.generate(PROMPTS, params)  # one batch of three
    return eng, [r.spec["accepted_per_step"] for r in results], [r.token_ids for r in results]


@pytest.mark.parametrize("algorithm", ["draft", "ngram"])
def test_batched_replay_walks_the_real_batches(tmp_path, algorithm):
    """A batch-3 trace drafting 7, replayed at fixed k as closed-loop streams, makes the real batch-3 run at k:
    its batches (every request verified once per step, the batch shrinking as requests finish) and tokens,
    where the trace determines them."""
    path = tmp_path / "batched.jsonl"
    eng, _, deep_tokens = run_together(config(3, algorithm, trace_out=str(path), trace_steps=7))
    eng.decoder.trace.close()
    recs = read_trace(path)
    assert max(r.batch_size for r in recs) == len(PROMPTS)
    cm = CostModel({b: {s: 1e-3 * b * (1 + 0.2 * s) for s in range(8)} for b in (1, 2, 4)})
    exact = 0
    for k in (1, 2, 3, 5):
        eng, real_accepted, tokens = run_together(config(k, algorithm))
        assert tokens == deep_tokens  # greedy: the same text whatever the steps
        st = eng.stats()["speculative"]
        pred = replay(fixed_config(k), recs, cm, initial_steps=k)
        if pred.lower_bound_verifies == 0:
            exact += 1
            assert (pred.verifies, pred.tokens) == (st["verify_batches"], st["emitted_tokens"]), k
            assert pred.batches_per_steps == {k: st["verify_batches"]}
        else:
            assert pred.tokens == st["emitted_tokens"]
    assert exact >= 2


def test_censored_matches_estimated_nearer_the_real_runs_than_the_bound(tmp_path):
    """A verify that accepted all 7 of its drafts leaves the match at its bonus position unknown, so a shallower
    replay landing inside that run only knows a lower bound. Counting the trace's odds for that match (how often
    an accepted run went on at its depth) lands nearer the real batch-3 runs at 3, 4, 5 and 6 steps than the
    bound, which counts every such match a miss and so favours the trace's own depth."""
    path = tmp_path / "deep.jsonl"
    eng, _, _ = run_together(config(3, trace_out=str(path), trace_steps=7))
    eng.decoder.trace.close()
    runs = Runs.of(read_trace(path))
    ((_, facts),) = runs.runs
    assert facts is not None and 0.3 < facts.cont < 1.0  # Laplace's rule keeps it off 1 on a short trace
    cm = CostModel({b: {s: 1e-3 * b * (1 + 0.2 * s) for s in range(8)} for b in (1, 2, 4)})
    est_err = bound_err = censored = 0
    for k in (3, 4, 5, 6):
        eng, _, _ = run_together(config(k))
        real = eng.stats()["speculative"]["verify_batches"]
        est = replay(fixed_config(k), runs, cm, initial_steps=k)
        bound = replay(fixed_config(k), bound_only(runs), cm, initial_steps=k)
        censored += est.lower_bound_verifies
        assert bound.verifies >= real
        est_err += abs(est.verifies - real)
        bound_err += abs(bound.verifies - real)
    assert censored > 0
    assert est_err < bound_err, (est_err, bound_err)
