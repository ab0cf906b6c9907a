"""End-to-end check that speculative sampling through the real decoder follows the target distribution.

Many copies of one request (same context, different seeds) run through one `SpeculativeDecoder.decode`
call per batch on the tiny random hybrid target. The first token each verify emits must follow the
target's sampling distribution for that context, and the second one the target's distribution given the
first; a Pearson chi-square test at significance level ALPHA = 0.001 (fixed seeds) checks both, for a
draft model that is close to the target (many acceptances), for a deterministic drafter that always
proposes the same token (point-mass q), and for a full-attention pair at temperature only, whose draft
chains (tokens and q) the small-row kernel draws. The pure maths, including a deliberately wrong drafter, is
tested on synthetic distributions in test_spec_verify.py.
"""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch

from specctl.engine.model_runner import ForwardItem, ModelRunner
from specctl.engine.sampling import SamplingParams, make_generator, probs_from_logits
from specctl.engine.sequence import Sequence
from specctl.engine.speculative.decoder import SpeculativeDecoder
from specctl.engine.speculative.drafter import DraftBuffers

from spec_support import ALPHA, chi_square_pvalue, engine_config, spy_chain_draws, write_models  # isort: skip

PREFIX = list(b"ab(c")
T0 = ord("=")
PARAMS = SamplingParams(max_tokens=100, temperature=1.0, top_k=6, ignore_eos=True)
# temperature only: a full-attention draft draws these in the small-row kernel's loop (ChainSampling)
PARAMS_T = SamplingParams(max_tokens=100, temperature=0.6, ignore_eos=True)
BATCH = 64
ROUNDS = 30


class FixedTokenDrafter:
    """Always proposes the same k tokens (a point mass; right only when the target happens to agree)."""

    name = "fixed"
    samples = False
    runner = None

    def __init__(self, token: int) -> None:
        self.token = token

    def propose(self, seqs, budgets, buf: DraftBuffers) -> None:  # type: ignore[no-untyped-def]
        for i, k in enumerate(budgets):
            buf.draft_tokens[i, :k] = self.token
            buf.num_drafts[i] = k

    def commit(self, seq, num_drafts, accepted) -> None:  # type: ignore[no-untyped-def]
        pass

    def release(self, rid: int) -> None:
        pass

    def stats(self) -> dict:
        return {}

    def export_request(self, seq) -> None:  # type: ignore[no-untyped-def]
        return None

    def import_request(self, seq, tensors, length) -> None:  # type: ignore[no-untyped-def]
        pass


@pytest.fixture(scope="module")
def models(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    return write_models(tmp_path_factory.mktemp("sampling"))


def target_probs(runner: ModelRunner, context: list[int], params: SamplingParams = PARAMS) -> torch.Tensor:
    with torch.no_grad():
        logits = runner.model(torch.tensor([context]))[0, -1:].float()
    return probs_from_logits(logits, [params])[0]


def merged_pvalue(counts: torch.Tensor, probs: torch.Tensor, n: int) -> float:
    """Chi-square p-value after pooling bins whose expected count is below 5 (test validity)."""
    keep = probs * n >= 5
    c = torch.cat([counts[keep], counts[~keep].sum().unsqueeze(0)])
    p = torch.cat([probs[keep], probs[~keep].sum().unsqueeze(0)])
    if float(p[-1]) == 0.0:
        c, p = c[:-1], p[:-1]
    return chi_square_pvalue(c, p)


def run(models: dict[str, str], drafter_kind: str, params: SamplingParams) -> tuple[list[list[int]], ModelRunner]:
    # full_draft: a full-attention pair (the kernel's chains need a full-attention draft)
    target, draft = ((models["draft_full"], models["full_noisy"]) if drafter_kind == "full_draft"
                     else (models["target"], models["draft_noisy"]))
    spec = {"algorithm": "draft", "draft": draft, "num_steps": 3}
    cfg = engine_config(target, spec, max_batch_size=BATCH)
    runner = ModelRunner(cfg.model_ref, max_requests=BATCH, max_draft_tokens=cfg.max_draft_tokens, page_size=4)
    drafter = FixedTokenDrafter(int(target_probs(runner, PREFIX + [T0]).argmax())) if drafter_kind == "fixed" else None
    dec = SpeculativeDecoder(runner, cfg, drafter=drafter)
    outs: list[list[int]] = []
    for r in range(ROUNDS):
        seqs = []
        for j in range(BATCH):
            p = replace(params, seed=1000 * r + j)
            s = Sequence(j, PREFIX, p)
            s.generator = make_generator(p, "cpu")
            s.output_ids = [T0]  # the first token, sampled at "prefill"; not cached yet
            runner.allocate(j, len(s) + 8)
            seqs.append(s)
        runner.forward([ForwardItem(s.rid, PREFIX, 0) for s in seqs])
        outs.extend(dec.decode(seqs))
        for s in seqs:
            dec.release(s)
            runner.free(s.rid)
    assert dec.stats()["accepted_tokens"] > 0.1 * dec.stats()["draft_tokens"]  # both verify branches ran
    return outs, runner


@pytest.mark.slow
@pytest.mark.parametrize("drafter_kind", ["draft_model", "fixed", "full_draft"])
def test_speculative_sampling_matches_target_end_to_end(models: dict[str, str], drafter_kind: str,
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    """draft_model: a hybrid draft (its per-step loop, top-k rows drawn in torch); fixed: a point-mass q;
    full_draft: a full-attention draft at temperature only, whose chains the small-row kernel draws in one
    call where it builds (checked), q coming from the kernel too."""
    from specctl.engine import smallgemm

    params = PARAMS_T if drafter_kind == "full_draft" else PARAMS
    drawn = spy_chain_draws(monkeypatch)
    outs, runner = run(models, drafter_kind, params)
    if drafter_kind == "full_draft" and smallgemm.kernel() is not None:
        assert drawn and all(drawn)
    n = len(outs)
    vocab = runner.facts.vocab_size
    p1 = target_probs(runner, PREFIX + [T0], params)
    first = torch.bincount(torch.tensor([o[0] for o in outs]), minlength=vocab)
    assert merged_pvalue(first, p1, n) > ALPHA
    # Second token, given the most frequent first token (it exists when the first draft was accepted).
    x = int(first.argmax())
    seconds = [o[1] for o in outs if len(o) > 1 and o[0] == x]
    assert len(seconds) >= 150, len(seconds)
    p2 = target_probs(runner, PREFIX + [T0, x], params)
    second = torch.bincount(torch.tensor(seconds), minlength=vocab)
    assert merged_pvalue(second, p2, len(seconds)) > ALPHA
    # Negative control: the same counts are rejected against a different context's distribution.
    assert merged_pvalue(first, target_probs(runner, PREFIX + [T0 + 1], params), n) < ALPHA
