"""OpenAI's logit processors: `logit_bias`, `presence_penalty` and `frequency_penalty`, applied to the
target's logits before sampling, greedy argmax or speculative verification.

Contract (OpenAI's definition, over the tokens generated so far, not the prompt):
    logits[t] += logit_bias[t] - presence_penalty * (count[t] > 0) - frequency_penalty * count[t]
- `adjust(seqs, logits)`: row i of `logits [n, V]` is the next-token distribution of `seqs[i]`, whose
  generated tokens are `output_ids`.
- `adjust_verify(seqs, target_logits, draft_tokens, num_drafts)`: row j of request b's verify logits
  follows x_0, d_1..d_j, so its counts also hold the drafts d_1..d_j. Greedy verification of adjusted
  logits therefore equals plain greedy decoding of adjusted logits, and rejection sampling draws from
  the adjusted target distribution, exactly as plain sampling does.
- Both return the input tensor untouched when no request uses a processor (the common case costs one
  Python check per request), else an adjusted copy (the raw logits stay for log-probs).
"""

from __future__ import annotations

from collections.abc import Sequence as Seq
from typing import TYPE_CHECKING

import torch

if TYPE_CHECKING:
    from specctl.engine.sampling_params import SamplingParams
    from specctl.engine.sequence import Sequence


def _active(params: SamplingParams) -> bool:
    return bool(params.logit_bias or params.presence_penalty or params.frequency_penalty)


def _apply(row: torch.Tensor, params: SamplingParams, counts: torch.Tensor) -> None:
    """In place on one `[..., V]` block whose last-dim counts are `counts` (same shape)."""
    if params.frequency_penalty:
        row -= params.frequency_penalty * counts
    if params.presence_penalty:
        row -= params.presence_penalty * (counts > 0).to(row.dtype)
    if params.logit_bias:
        ids = torch.as_tensor([t for t, _ in params.logit_bias], device=row.device)
        bias = torch.as_tensor([b for _, b in params.logit_bias], device=row.device, dtype=row.dtype)
        row[..., ids] += bias


def _counts(tokens: Seq[int], vocab: int, device: torch.device, dtype: torch.dtype) -> torch.Tensor:
    if not tokens:
        return torch.zeros(vocab, device=device, dtype=dtype)
    return torch.bincount(torch.as_tensor(list(tokens), device=device), minlength=vocab)[:vocab].to(dtype)


def adjust(seqs: Seq[Sequence], logits: torch.Tensor) -> torch.Tensor:
    """Next-token logits `[len(seqs), V]` with each request's processors applied."""
    rows = [i for i, s in enumerate(seqs) if _active(s.params)]
    if not rows:
        return logits
    out = logits.float().clone()
    vocab = out.shape[-1]
    for i in rows:
        seq = seqs[i]
        _apply(out[i], seq.params, _counts(seq.output_ids, vocab, out.device, out.dtype))
    return out


def adjust_verify(seqs: Seq[Sequence], target_logits: torch.Tensor, draft_tokens: torch.Tensor,
                  num_drafts: torch.Tensor) -> torch.Tensor:
    """Verify logits `[B, K + 1, V]` with the processors applied per position (module docstring)."""
    rows = [i for i, s in enumerate(seqs) if _active(s.params)]
    if not rows:
        return target_logits
    out = target_logits.float().clone()
    k1, vocab = out.shape[1], out.shape[2]
    nd = num_drafts.tolist()
    drafts = draft_tokens.tolist()
    for b in rows:
        seq = seqs[b]
        base = _counts(seq.output_ids, vocab, out.device, out.dtype)
        counts = base.unsqueeze(0).repeat(k1, 1)  # row j: output + d_1..d_j
        for j in range(1, min(k1, nd[b] + 1)):
            counts[j:, int(drafts[b][j - 1])] += 1
        _apply(out[b], seq.params, counts)
    return out
