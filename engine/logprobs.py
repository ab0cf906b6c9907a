"""Log-probabilities of generated tokens, for requests that ask for them (`SamplingParams.logprobs`).

Contract:
- A token's log-probability is the target model's `log_softmax` of the logits that chose it, before
  temperature, top-k or top-p (vLLM's default "raw" log-probs; OpenAI reports the model's own
  distribution): so greedy and sampled requests, plain and speculative decoding all report the same
  numbers for the same context.
- With speculation, row j of the target's verify logits is the target's distribution for the token
  that follows x_0, d_1..d_j (`engine/speculative/verify.py`), whichever drafter proposed: accepted drafts and the
  target's own token take their log-probs from those rows, never from the drafter.
- A decoder hands the engine `seq.pending_logprobs`, one `TokenLogprob` per token it returns; the engine
  keeps the ones whose token enters the output (`Sequence.append`). Requests that did not ask pay nothing.
"""

from __future__ import annotations

from collections.abc import Sequence as Seq
from typing import Any, NamedTuple

import torch

MAX_TOP_LOGPROBS = 20


class TokenLogprob(NamedTuple):
    """One generated token: its log-probability and the `k` most likely tokens (id, log-prob) there."""

    logprob: float
    top: list[tuple[int, float]]


def _wanted(seqs: Seq[Any]) -> list[int]:
    return [i for i, s in enumerate(seqs) if getattr(s.params, "logprobs", None) is not None]


def _entries(logits: torch.Tensor, tokens: list[int], k: int) -> list[TokenLogprob]:
    """`logits [n, V]` and the n tokens they chose -> n entries with the top `k` alternatives."""
    lp = torch.log_softmax(logits.float(), dim=-1)
    chosen = lp.gather(1, torch.as_tensor(tokens, device=lp.device).unsqueeze(1)).squeeze(1).tolist()
    if k > 0:
        values, ids = lp.topk(min(k, lp.shape[1]), dim=-1)
        tops = [list(zip(i, v, strict=True)) for i, v in zip(ids.tolist(), values.tolist(), strict=True)]
    else:
        tops = [[] for _ in tokens]
    return [TokenLogprob(float(c), t) for c, t in zip(chosen, tops, strict=True)]


def attach(seqs: Seq[Any], logits: torch.Tensor, tokens: Seq[int]) -> None:
    """One token per sequence from row i of `logits [len(seqs), V]` (plain decoding, a prefill's first token)."""
    for i in _wanted(seqs):
        seqs[i].pending_logprobs = _entries(logits[i : i + 1], [int(tokens[i])], int(seqs[i].params.logprobs))


def attach_verify(seqs: Seq[Any], target_logits: torch.Tensor, new_tokens: Seq[Seq[int]]) -> None:
    """Speculative verify: request i's tokens come from rows 0..len(new_tokens[i]) - 1 of
    `target_logits [B, K + 1, V]` (accepted drafts, then the target's own token)."""
    for i in _wanted(seqs):
        toks = [int(t) for t in new_tokens[i]]
        seqs[i].pending_logprobs = _entries(target_logits[i, : len(toks)], toks, int(seqs[i].params.logprobs))
