"""Speculative greedy decoding reproduces plain greedy decoding token for token.

Oracle: each prompt alone through plain greedy decoding. Every speculative run below uses a tiny random
hybrid target (mamba + swa + full layers, swa window 6, page size 4), so verify rollbacks restore mamba
states, swa windows and paged KV at every accept length; requests arrive in waves while others decode
and leave at different lengths (batch sizes 1..8).
"""

from __future__ import annotations

import pytest
import torch

from specctl.engine.engine import Engine
from specctl.engine.sampling_params import SamplingParams

from spec_support import (  # isort: skip
    PROMPTS, ScriptedDrafter, engine_config, noisy, plain_outputs, run_join_leave, spec_engine, write_models,
)

LENGTHS = [12, 9, 15, 5, 10, 13, 6, 8]
SHORT = 4  # the draft-model runs use the first SHORT prompts (its forwards dominate test time)


@pytest.fixture(scope="module")
def models(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    torch.manual_seed(0)
    return write_models(tmp_path_factory.mktemp("spec"))


@pytest.fixture(scope="module")
def reference(models: dict[str, str]) -> list[list[int]]:
    out = plain_outputs(models["target"], PROMPTS, LENGTHS)
    assert [len(o) for o in out] == LENGTHS
    return out


@pytest.mark.parametrize("steps", range(8))
def test_ngram_fixed_steps_equal_plain(models: dict[str, str], reference: list[list[int]], steps: int) -> None:
    spec = {"algorithm": "ngram", "num_steps": steps, "ngram": {"min_match": 1, "max_match": 3}}
    engine, dec = spec_engine(engine_config(models["target"], spec))
    assert run_join_leave(engine, PROMPTS, LENGTHS) == reference
    st = dec.stats()
    assert st["runtime_states"] == [steps]
    if steps:
        assert st["draft_tokens"] > 0  # the prompts repeat, so lookup proposes something
    assert engine.runner.num_free_pages == engine.runner.num_total_pages


@pytest.mark.parametrize("steps", range(8))
def test_draft_model_fixed_steps_equal_plain(models: dict[str, str], reference: list[list[int]], steps: int) -> None:
    # A hybrid (mamba + swa) draft model: its own cache is rolled back after every verify too.
    spec = {"algorithm": "draft", "draft": models["draft_hybrid"], "num_steps": steps}
    engine, dec = spec_engine(engine_config(models["target"], spec))
    assert run_join_leave(engine, PROMPTS[:SHORT], LENGTHS[:SHORT]) == reference[:SHORT]
    draft_runner = dec.drafter.runner  # type: ignore[attr-defined]
    assert draft_runner.num_free_pages == draft_runner.num_total_pages  # released with the requests
    if steps:
        assert dec.stats()["drafter"]["forwards"] > 0


def test_noisy_draft_model_partial_acceptance_equal_plain(models: dict[str, str], reference: list[list[int]]) -> None:
    """A perturbed copy of the target as draft: many different accept lengths, stateful draft rollbacks."""
    spec = {"algorithm": "draft", "draft": models["draft_noisy"], "num_steps": 4}
    engine, dec = spec_engine(engine_config(models["target"], spec))
    assert run_join_leave(engine, PROMPTS[:SHORT], LENGTHS[:SHORT]) == reference[:SHORT]
    st = dec.stats()
    assert 0.05 < st["acceptance_rate"] < 0.95, st["acceptance_rate"]
    assert len(st["acceptance_histogram"]) >= 3, st["acceptance_histogram"]


def test_scripted_drafter_every_accept_length_equal_plain(models: dict[str, str], reference: list[list[int]]) -> None:
    oracle = {tuple(p): r for p, r in zip(PROMPTS, reference, strict=True)}
    drafter = ScriptedDrafter(oracle, noisy(0.2))
    engine, dec = spec_engine(engine_config(models["target"], {"algorithm": "ngram", "num_steps": 7}), drafter)
    assert run_join_leave(engine, PROMPTS, LENGTHS) == reference
    hist = dec.stats()["acceptance_histogram"]
    assert len(hist) >= 6, hist  # rollbacks to (almost) every depth 0..7 happened


def test_adaptive_forced_switching_equal_plain(models: dict[str, str], reference: list[list[int]]) -> None:
    """Switch steps every verify (alpha 1, no warmup, interval 1) while requests are mid-flight."""
    oracle = {tuple(p): r for p, r in zip(PROMPTS, reference, strict=True)}
    # Phases of right and wrong drafts along each output (positions 0-7 right, 8-13 wrong, ...).
    drafter = ScriptedDrafter(oracle, lambda seq, pos: (pos // 7) % 2 == 1)
    adaptive = {"ema_alpha": 1.0, "warmup_batches": 0, "update_interval": 1,
                "buckets": {"1": {"candidate_steps": [0, 1, 3, 7]}, "4": {"candidate_steps": [0, 2, 5]}}}
    spec = {"algorithm": "ngram", "num_steps": 3, "adaptive": adaptive}
    engine, dec = spec_engine(engine_config(models["target"], spec, graph_batch_sizes=(1, 2, 4, 8)), drafter)
    used: set[int] = set()
    out = run_join_leave(engine, PROMPTS, LENGTHS, on_step=lambda: used.add(dec.last_state.steps)
                         if dec.last_state is not None else None)
    assert out == reference
    st = dec.stats()
    assert len(st["switches"]) >= 6, st["switches"]
    assert {s["bucket"] for s in st["switches"]} == {1, 4}
    assert len(used) >= 3 and used <= {0, 1, 2, 3, 5, 7}, used
    assert st["runtime_states"] == [0, 1, 2, 3, 5, 7]


def test_steps_zero_sampling_is_plain_sampling(models: dict[str, str]) -> None:
    """Steps 0 runs through the verify path yet draws exactly what plain sampling draws (same seed)."""
    params = [SamplingParams(max_tokens=15, temperature=0.9, top_k=40, seed=s, ignore_eos=True) for s in range(4)]
    prompts = PROMPTS[:4]
    plain = Engine(engine_config(models["target"])).generate(prompts, params)
    engine, _ = spec_engine(engine_config(models["target"], {"algorithm": "ngram", "num_steps": 0}))
    spec = engine.generate(prompts, params)
    assert [r.token_ids for r in spec] == [r.token_ids for r in plain]


def test_seeded_speculative_sampling_is_batch_invariant(models: dict[str, str]) -> None:
    spec = {"algorithm": "draft", "draft": models["draft_noisy"], "num_steps": 3}
    p = SamplingParams(max_tokens=20, temperature=1.0, seed=123, ignore_eos=True)
    engine, _ = spec_engine(engine_config(models["target"], spec))
    alone = engine.generate([PROMPTS[0]], p)[0].token_ids
    others = [SamplingParams(max_tokens=n, temperature=0.7, seed=n, ignore_eos=True) for n in (5, 30, 11)]
    engine2, _ = spec_engine(engine_config(models["target"], spec))
    together = engine2.generate([PROMPTS[1], PROMPTS[0], PROMPTS[2], PROMPTS[3]], [others[0], p, others[1], others[2]])
    assert together[1].token_ids == alone


def test_generation_result_carries_acceptance(models: dict[str, str], reference: list[list[int]]) -> None:
    oracle = {tuple(p): r for p, r in zip(PROMPTS, reference, strict=True)}
    engine, dec = spec_engine(engine_config(models["target"], {"algorithm": "ngram", "num_steps": 3}),
                              ScriptedDrafter(oracle, lambda seq, pos: False))
    res = engine.generate([PROMPTS[2]], SamplingParams(max_tokens=15, ignore_eos=True))[0]
    assert res.token_ids == reference[2]
    # 15 tokens: prefill gives 1, then 3 verifies of 4 tokens (3 accepted + 1), then one whose drafts are
    # capped at 1 so that it cannot overshoot max_tokens (1 accepted + 1).
    assert res.spec["accepted_per_step"] == [3, 3, 3, 1]
    st = engine.stats()["speculative"]
    assert st["acceptance_histogram"] == {"1": 1, "3": 3}
    assert st["mean_tokens_per_verify"] == pytest.approx(14 / 4)


def test_runtime_state_sizes_match_steps(models: dict[str, str]) -> None:
    adaptive = {"buckets": {"1": {"candidate_steps": [1, 3, 5, 7]}, "8": {"candidate_steps": [0, 1, 3]}}}
    cfg = engine_config(models["target"], {"algorithm": "ngram", "num_steps": 3, "adaptive": adaptive})
    _, dec = spec_engine(cfg)
    assert sorted(dec.states) == [0, 1, 3, 5, 7]
    for s, st in dec.states.items():
        assert st.draft_tokens.shape == (8, s) and st.logits_pad.shape[:2] == (8, s + 1)
    assert dec.lookahead == 8



def test_draft_cache_handover_matches_rebuilding_from_tokens(models: dict[str, str]) -> None:
    """PD: prefill exports the (hybrid) draft model's cache, decode imports it, and drafts exactly what a
    decoder that rebuilt the draft cache from the tokens drafts."""
    from specctl.engine.sequence import Sequence
    from specctl.engine.speculative.drafter import DraftBuffers

    spec = {"algorithm": "draft", "draft": models["draft_hybrid"], "num_steps": 4}
    cfg = engine_config(models["target"], spec)
    prefill_side, decode_side, rebuilt = (spec_engine(cfg)[1] for _ in range(3))

    def seq() -> Sequence:
        s = Sequence(5, PROMPTS[0], SamplingParams(max_tokens=50, ignore_eos=True))
        s.output_ids = [65]  # the first token, sampled by prefill
        return s

    exported = prefill_side.export_draft(seq())
    assert exported is not None
    tensors, length = exported
    assert length == len(PROMPTS[0])
    draft_pool = prefill_side.drafter.runner  # type: ignore[attr-defined]
    assert draft_pool.num_free_pages == draft_pool.num_total_pages  # exported and released

    proposals = []
    for dec, s in ((decode_side, seq()), (rebuilt, seq())):
        if dec is decode_side:
            dec.import_draft(s, tensors, length)
            assert dec.drafter.runner.cached_len(s.rid) == length  # type: ignore[attr-defined]
        st = dec.states[4]
        buf = DraftBuffers(st.draft_tokens[:1], st.num_drafts[:1], None)
        dec.drafter.propose([s], [4], buf)
        proposals.append(st.draft_tokens[0].tolist())
    assert proposals[0] == proposals[1]
