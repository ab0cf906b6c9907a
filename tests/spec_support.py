"""Helpers for the speculative-decoding tests (test_spec_*.py): tiny random models, engines, scripted drafters.

Scripted drafters know the target's plain greedy continuation of each prompt (computed first by a plain
engine: the oracle) and propose it exactly, never, or corrupted on a deterministic schedule. They
implement the `Drafter` protocol of specctl.engine.speculative.drafter and make acceptance lengths controllable,
which is what the adaptive-policy and rollback tests need.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import torch

from specctl.engine.checkpoint import load_model, save_model, write_random_model
from specctl.engine.config import EngineConfig
from specctl.engine.engine import Engine
from specctl.engine.model_runner import ModelRunner
from specctl.engine.sampling_params import SamplingParams
from specctl.engine.speculative.decoder import SpeculativeDecoder
from specctl.engine.speculative.drafter import DraftBuffers
from specctl.schemas.role_config import SpeculativeConfig

VOCAB = 260
ALPHA = 0.001  # the stated significance level of every goodness-of-fit test (test_spec_verify/_sampling)


def chi_square_pvalue(counts: torch.Tensor, probs: torch.Tensor) -> float:
    """Pearson chi-square p-value of observed counts against expected probabilities (bins with p > 0)."""
    n = counts.sum().double()
    keep = probs > 0
    assert int(counts[~keep].sum()) == 0, "a token with target probability 0 was emitted"
    expected = probs[keep].double() * n
    stat = ((counts[keep].double() - expected) ** 2 / expected).sum()
    df = int(keep.sum()) - 1
    # Survival function of chi2(df) = regularized upper incomplete gamma Q(df/2, stat/2).
    return float(torch.special.gammaincc(torch.tensor(df / 2, dtype=torch.float64), stat / 2))


# Token-id prompts (bytes), with repetition so n-gram lookup finds matches.
PROMPTS: list[list[int]] = [
    list(b"def f(x):\n    return x + 1\ndef g(x):\n    return"),
    list(b"abcabcabcab"),
    list(b"import os\nimport sys\nimport"),
    [7],
    list(b"the cat sat on the mat; the cat"),
    list(b"0123456789012345"),
    list(b"if x:\n    y = 1\nif y:\n    x"),
    list(b"zz"),
]


def _noisy_copy(src: Path, dst: Path, seed: int) -> Path:
    """A perturbed copy of the model at src: agrees with it often but not always."""
    import json

    model = load_model(str(src))
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn(p.shape, generator=g) * 0.1 * p.std().clamp(min=1e-3))
    save_model(model, dst, json.loads((src / "config.json").read_text()))
    return dst


def write_models(root: Path) -> dict[str, str]:
    """Target (mamba, swa, full, swa; window 6) and three drafts: hybrid random, full-only random and
    a noisy copy of the target (partial acceptance with a stateful draft); plus full_noisy, a noisy copy
    of draft_full (a full-attention pair: draft_full as the target, full_noisy as its draft)."""
    target = write_random_model(root / "target", sliding_window=6, seed=0)
    draft_hybrid = write_random_model(root / "draft_hybrid", layer_kinds=("mamba", "swa"), sliding_window=4, seed=1)
    draft_full = write_random_model(root / "draft_full", layer_kinds=("full",), seed=2)
    return {"target": str(target), "draft_hybrid": str(draft_hybrid), "draft_full": str(draft_full),
            "draft_noisy": str(_noisy_copy(target, root / "draft_noisy", 3)),
            "full_noisy": str(_noisy_copy(draft_full, root / "full_noisy", 4))}


def engine_config(target: str, spec: dict[str, Any] | None = None, **kw: Any) -> EngineConfig:
    base: dict[str, Any] = dict(model_ref=target, device="cpu", page_size=4, max_tokens=4096, max_batch_size=8)
    base.update(kw)
    return EngineConfig(speculative=SpeculativeConfig.from_json(spec or {"algorithm": "none"}), **base)


def spec_engine(cfg: EngineConfig, drafter: Any = None) -> tuple[Engine, SpeculativeDecoder]:
    """An Engine whose decoder is our SpeculativeDecoder (optionally with a scripted drafter)."""
    runner = ModelRunner(cfg.model_ref, device="cpu", page_size=cfg.page_size, max_tokens=cfg.max_tokens,
                         max_requests=cfg.max_batch_size, max_draft_tokens=cfg.max_draft_tokens)
    dec = SpeculativeDecoder(runner, cfg, drafter=drafter)
    return Engine(cfg, runner=runner, decoder=dec), dec


def greedy(n: int) -> SamplingParams:
    return SamplingParams(max_tokens=n, ignore_eos=True)


def run_join_leave(engine: Engine, prompts: Sequence[Sequence[int]], lengths: Sequence[int],
                   on_step: Callable[[], None] | None = None) -> list[list[int]]:
    """Requests arrive in three waves while earlier ones decode, and leave at different lengths."""
    n = len(prompts)
    waves = [range(0, min(3, n)), range(min(3, n), min(6, n)), range(min(6, n), n)]
    rids: dict[int, int] = {}
    done: dict[int, list[int]] = {}
    for w, wave in enumerate(waves):
        for i in wave:
            rids[engine.add_request(list(prompts[i]), greedy(lengths[i]))] = i
        for _ in range(3 if w < len(waves) - 1 else 10**6):
            for seq in engine.step():
                if seq.is_finished:
                    done[rids[seq.rid]] = list(seq.output_ids)
            if on_step is not None:
                on_step()
            if w == len(waves) - 1 and len(done) == len(rids):
                break
    assert not engine.has_unfinished()
    return [done[i] for i in range(len(prompts))]


def plain_outputs(target: str, prompts: Sequence[Sequence[int]], lengths: Sequence[int]) -> list[list[int]]:
    """The oracle: each prompt alone through plain greedy decoding."""
    eng = Engine(engine_config(target))
    return [eng.generate([list(p)], greedy(n))[0].token_ids for p, n in zip(prompts, lengths, strict=True)]


class ScriptedDrafter:
    """Proposes the oracle's greedy continuation, corrupted where `wrong(seq, position)` says so.

    `position` is the index in the request's output of the token being proposed. The oracle table is
    keyed by prompt; positions beyond the oracle's length are proposed as token 0.
    """

    name = "scripted"
    samples = False
    runner = None

    def __init__(self, oracle: dict[tuple[int, ...], list[int]], wrong: Callable[[Any, int], bool]) -> None:
        self.oracle = oracle
        self.wrong = wrong
        self.proposed = 0

    def propose(self, seqs: Sequence[Any], budgets: Sequence[int], buf: DraftBuffers) -> None:
        for i, (seq, k) in enumerate(zip(seqs, budgets, strict=True)):
            ref = self.oracle[tuple(seq.prompt_ids)]
            start = len(seq.output_ids)
            toks = []
            for pos in range(start, start + k):
                t = ref[pos] if pos < len(ref) else 0
                toks.append((t + 1) % VOCAB if self.wrong(seq, pos) else t)
            if toks:
                buf.draft_tokens[i, : len(toks)] = torch.as_tensor(toks)
            buf.num_drafts[i] = len(toks)
            self.proposed += len(toks)

    def commit(self, seq: Any, num_drafts: int, accepted: int) -> None:
        pass

    def release(self, rid: int) -> None:
        pass

    def stats(self) -> dict[str, Any]:
        return {"drafter": self.name, "proposed": self.proposed}

    def export_request(self, seq: Any) -> None:
        return None

    def import_request(self, seq: Any, tensors: dict[str, torch.Tensor], length: int) -> None:
        pass


def always_right(seq: Any, pos: int) -> bool:
    return False


def always_wrong(seq: Any, pos: int) -> bool:
    return True


def noisy(rate: float) -> Callable[[Any, int], bool]:
    """Wrong at a deterministic pseudo-random ~rate of (request, position) pairs."""

    def wrong(seq: Any, pos: int) -> bool:
        h = hashlib.sha256(f"{seq.prompt_ids[:4]}:{pos}".encode()).digest()
        return h[0] < rate * 256

    return wrong


def spy_chain_draws(monkeypatch: Any) -> list[bool]:
    """Record, per call of the small-row kernel's fused draft chain, whether the kernel drew the tokens
    (`sampling` given) rather than taking argmaxes; the calls still run."""
    from specctl.engine import smallgemm

    calls: list[bool] = []
    fused = smallgemm.SmallGemm.lone_chains

    def spy(self: Any, model: Any, layers: Any, bases: Any, starts: Any, feeds: Any, steps: Any,
            logits_out: Any = None, sampling: Any = None) -> list[list[int]]:
        calls.append(sampling is not None)
        return fused(self, model, layers, bases, starts, feeds, steps, logits_out, sampling)

    monkeypatch.setattr(smallgemm.SmallGemm, "lone_chains", spy)
    return calls
