"""Adaptive steps in the engine, driven by scripted drafters (always right / always wrong).

The expected step sequences below are derived by hand from the SGLang EMA semantics (docs/adaptive.md,
"How the policy decides") for ema_alpha 0.5, warmup_batches 2, update_interval 2, initial steps 3:
- bucket 1 (candidates 1,3,5,7; down_hysteresis -0.25), always right: EMA 2 -> 2.5, 2.75, 2.875, 2.9375
  (decision: > 3 - 0.5, climb to 5; not > 4.5, stop) -> 3.97, 4.48 (decision: not > 4.5, hold) -> 4.74,
  4.87 (decision: > 4.5, climb to 7) -> 7 from then on.
- bucket 1, always wrong: EMA 2 -> 1, .5, .25, .125 (decision: <= 1 - 0.5 - 0.25, drop to 1) -> stays 1.
- bucket 8 (candidates 0,1,3; down_hysteresis 0), always wrong: 3,3,3,3 (decision: .125 <= .5 twice:
  drop to 0), 0,0 (steps 0 learns nothing; decision: probe 1), 1,1 (EMA .0625 -> .03: drop to 0), 0,0, ...
"""

from __future__ import annotations

import json

import pytest

from specctl.engine.speculative.decoder import RuntimeState
from specctl.errors import RuntimeFailure
from specctl.schemas.adaptive import check_deployment_steps

from spec_support import (  # isort: skip
    ScriptedDrafter, always_right, always_wrong, engine_config, greedy, plain_outputs, spec_engine, write_models,
)

ADAPTIVE = {
    "ema_alpha": 0.5,
    "warmup_batches": 2,
    "update_interval": 2,
    "buckets": {"1": {"candidate_steps": [1, 3, 5, 7]},
                "8": {"candidate_steps": [0, 1, 3], "down_hysteresis": 0.0}},
}
RIGHT_PROMPT = list(b"def main():\n    ")
WRONG_PROMPTS = [list(f"prompt {i}: ".encode()) for i in range(6)]


@pytest.fixture(scope="module")
def target(tmp_path_factory: pytest.TempPathFactory) -> str:
    return write_models(tmp_path_factory.mktemp("adaptive"))["target"]


@pytest.fixture(scope="module")
def oracle(target: str) -> dict[tuple[int, ...], list[int]]:
    prompts = [RIGHT_PROMPT, *WRONG_PROMPTS]
    outs = plain_outputs(target, prompts, [80] + [14] * len(WRONG_PROMPTS))
    return {tuple(p): o for p, o in zip(prompts, outs, strict=True)}


def make(target: str, oracle: dict, wrong, **kw):  # type: ignore[no-untyped-def]
    spec = {"algorithm": "ngram", "num_steps": 3, "adaptive": ADAPTIVE}
    return spec_engine(engine_config(target, spec, **kw), ScriptedDrafter(oracle, wrong))


def run_recording(engine, dec, prompts, max_tokens):  # type: ignore[no-untyped-def]
    """Run to completion; the steps of every verify batch, in order, and the outputs."""
    rids = [engine.add_request(p, greedy(max_tokens)) for p in prompts]
    steps: list[int] = []
    outputs: dict[int, list[int]] = {}
    while len(outputs) < len(rids):
        before = dec.stats()["verify_batches"]
        for seq in engine.step():
            if seq.is_finished:
                outputs[seq.rid] = list(seq.output_ids)
        if dec.stats()["verify_batches"] > before:
            steps.append(dec.last_state.steps)
    return steps, [outputs[r] for r in rids]


def test_always_right_climbs_bucket_1(target: str, oracle: dict) -> None:
    engine, dec = make(target, oracle, always_right)
    steps, outs = run_recording(engine, dec, [RIGHT_PROMPT], 80)
    assert outs[0] == oracle[tuple(RIGHT_PROMPT)]
    assert steps[:11] == [3, 3, 3, 3, 5, 5, 5, 5, 7, 7, 7]
    sw = dec.stats()["switches"]
    assert [(s["bucket"], s["from_steps"], s["to_steps"]) for s in sw] == [(1, 3, 5), (1, 5, 7)]
    assert [s["ema"] for s in sw] == pytest.approx([2.9375, 4.87109375])
    assert sw[0]["time"] <= sw[1]["time"]


def test_always_wrong_falls_in_bucket_1(target: str, oracle: dict) -> None:
    engine, dec = make(target, oracle, always_wrong)
    steps, outs = run_recording(engine, dec, [WRONG_PROMPTS[0]], 14)
    assert outs[0] == oracle[tuple(WRONG_PROMPTS[0])]
    assert steps == [3, 3, 3, 3] + [1] * 9
    assert [(s["from_steps"], s["to_steps"]) for s in dec.stats()["switches"]] == [(3, 1)]


def test_buckets_are_independent_and_steps_zero_probes(target: str, oracle: dict) -> None:
    """Bucket 1 climbs on one right request; then six wrong requests (padded to graph size 8, so bucket 8)
    walk 3 -> 0 -> 1 -> 0 -> 1 while bucket 1 keeps its state untouched."""
    engine, dec = make(target, oracle, lambda seq, pos: tuple(seq.prompt_ids) != tuple(RIGHT_PROMPT),
                       graph_batch_sizes=(1, 2, 4, 8))
    steps_a, _ = run_recording(engine, dec, [RIGHT_PROMPT], 80)
    assert steps_a[:9] == [3, 3, 3, 3, 5, 5, 5, 5, 7]
    bucket1 = dec.stats()["buckets"]["1"]
    steps_b, outs = run_recording(engine, dec, WRONG_PROMPTS, 14)
    assert outs == [oracle[tuple(p)] for p in WRONG_PROMPTS]
    assert steps_b == [3, 3, 3, 3, 0, 0, 1, 1, 0, 0, 1, 1, 0]
    st = dec.stats()
    assert st["buckets"]["1"] == bucket1  # untouched by batches of 6 (routed to bucket 8)
    b8 = [(s["from_steps"], s["to_steps"]) for s in st["switches"] if s["bucket"] == 8]
    assert b8 == [(3, 0), (0, 1), (1, 0), (0, 1), (1, 0)]
    assert st["buckets"]["8"]["batches"] == 13
    json.dumps(st)  # the stats are plain JSON for `generate --format json` and /server_info


def test_switch_uses_prebuilt_state_and_allocates_none(target: str, oracle: dict,
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    engine, dec = make(target, oracle, lambda seq, pos: tuple(seq.prompt_ids) != tuple(RIGHT_PROMPT),
                       graph_batch_sizes=(1, 2, 4, 8))
    states = dec.states
    snapshot = {s: {k: (id(t), t.data_ptr()) for k, t in st.buffers().items()} for s, st in states.items()}
    built: list[int] = []
    monkeypatch.setattr(RuntimeState, "build", classmethod(lambda cls, *a, **k: built.append(1)))
    seen: list[RuntimeState] = []

    orig = dec.decode

    def spy(seqs):  # type: ignore[no-untyped-def]
        out = orig(seqs)
        seen.append(dec.last_state)
        return out

    dec.decode = spy  # type: ignore[method-assign]
    run_recording(engine, dec, [RIGHT_PROMPT], 80)
    run_recording(engine, dec, WRONG_PROMPTS, 14)
    assert len(dec.stats()["switches"]) >= 7
    assert {s.steps for s in seen} == {0, 1, 3, 5, 7}
    assert built == []  # no runtime state was built after start-up
    assert dec.states is states
    assert all(s is states[s.steps] for s in seen)
    assert {s: {k: (id(t), t.data_ptr()) for k, t in st.buffers().items()} for s, st in states.items()} == snapshot


def test_startup_refuses_uncovered_initial_steps_with_validate_finding(target: str) -> None:
    spec = {"algorithm": "ngram", "num_steps": 4, "adaptive": ADAPTIVE}
    cfg = engine_config(target, spec)
    _, findings = check_deployment_steps({"speculative": spec, "serve": {"max_batch_size": 8}})
    (finding,) = [f for f in findings if f.severity == "error"]
    with pytest.raises(RuntimeFailure) as exc:
        spec_engine(cfg)
    assert exc.value.exit_code == 3
    assert finding.code == "ADP101" and finding.code in str(exc.value) and finding.message in str(exc.value)
    assert exc.value.hint == finding.fix


def test_startup_refuses_runner_too_small_for_largest_step(target: str) -> None:
    from specctl.engine.model_runner import ModelRunner
    from specctl.engine.speculative.decoder import SpeculativeDecoder

    cfg = engine_config(target, {"algorithm": "ngram", "num_steps": 3, "adaptive": ADAPTIVE})
    runner = ModelRunner(target, max_requests=8, max_draft_tokens=5)  # steps 7 needs 7 drafts' rollback
    with pytest.raises(RuntimeFailure, match="max_draft_tokens"):
        SpeculativeDecoder(runner, cfg)


@pytest.mark.parametrize("spec, match", [
    ({"algorithm": "ngram", "num_steps": 3, "topk": 4}, "topk"),
    ({"algorithm": "ngram", "num_steps": 3, "ngram": {"min_match": 3, "max_match": 2}}, "min_match"),
    ({"algorithm": "draft", "num_steps": 3}, "speculative.draft"),
])
def test_startup_refuses_unsupported_speculative_settings(target: str, spec: dict, match: str) -> None:
    with pytest.raises(RuntimeFailure, match=match) as exc:
        spec_engine(engine_config(target, spec))
    assert exc.value.exit_code == 3
