"""Sampling: how one row of logits becomes a token, for a whole batch in one call.

Contract:
- `SamplingParams` (engine/sampling_params.py, torch-free) is a request's frozen sampling recipe.
- `sample(logits, params, generators)` takes float logits `[n, V]` (one row per request, any
  device) and returns a `LongTensor [n]` on the same device. Rows at temperature 0 are greedy
  (argmax). Other rows are temperature-scaled, top-k / top-p filtered, and drawn with the row's own
  `torch.Generator`, so a seeded request produces the same tokens whatever else is in the batch.
- `probs_from_logits` and `sample_from_probs` expose the two halves so speculative verification
  (rejection sampling) can work with exactly the distribution plain sampling draws from.

The hot path is batched: one sort (only if some row filters), one softmax, one cumulative sum and one
`searchsorted` for the whole batch; the only per-row Python work is drawing one uniform number from
each sampled row's generator (a generator is per request, so the draw cannot be fused).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from specctl.engine import ops
from specctl.engine.sampling_params import SamplingParams


def temperature_only(params: SamplingParams, vocab: int) -> bool:
    """Greedy, or a temperature without a top-k or top-p filter: the rows the small-row kernel draws and
    verifies itself (draft chains, speculative sampling), as softmax(logits / temperature)."""
    return params.greedy or ((params.top_k == 0 or params.top_k >= vocab) and params.top_p >= 1.0)


def make_generator(params: SamplingParams, device: torch.device | str) -> torch.Generator | None:
    """The request's own random stream: None for greedy requests (they draw nothing)."""
    if params.greedy:
        return None
    gen = torch.Generator(device=device)
    if params.seed is None:
        gen.seed()  # nondeterministic seed from the OS
    else:
        gen.manual_seed(params.seed)
    return gen


def probs_from_logits(logits: torch.Tensor, params: Sequence[SamplingParams]) -> torch.Tensor:
    """Per-row sampling distribution `[n, V]` (float32) after temperature, top-k and top-p.

    Greedy rows get a one-hot distribution at their argmax, so callers (speculative verification)
    can treat every row alike.
    """
    n, vocab = logits.shape
    assert len(params) == n, (len(params), n)
    logits = logits.float()
    device = logits.device
    greedy = torch.tensor([p.greedy for p in params], device=device)
    temps = torch.tensor([p.temperature if not p.greedy else 1.0 for p in params], device=device)
    scaled = logits / temps.unsqueeze(1)

    need_k = any(0 < p.top_k < vocab for p in params)
    need_p = any(p.top_p < 1.0 for p in params)
    if need_k or need_p:
        # One descending sort serves both filters; masks are built in sorted order, then scattered back.
        sorted_logits, order = torch.sort(scaled, dim=-1, descending=True)
        remove = torch.zeros_like(sorted_logits, dtype=torch.bool)
        if need_k:
            ks = torch.tensor([p.top_k if 0 < p.top_k < vocab else vocab for p in params], device=device)
            ranks = torch.arange(vocab, device=device).unsqueeze(0)
            remove |= ranks >= ks.unsqueeze(1)
        if need_p:
            ps = torch.tensor([float(p.top_p) for p in params], device=device)
            sorted_probs = torch.softmax(sorted_logits.masked_fill(remove, float("-inf")), dim=-1)
            # Keep the smallest prefix whose mass reaches top_p: drop a token when the mass strictly
            # before it already reaches top_p (so the most likely token always survives).
            mass_before = torch.cumsum(sorted_probs, dim=-1) - sorted_probs
            remove |= mass_before >= ps.unsqueeze(1)
        mask = torch.zeros_like(remove).scatter(1, order, remove)
        scaled = scaled.masked_fill(mask, float("-inf"))

    probs = torch.softmax(scaled, dim=-1)
    if bool(greedy.any()):
        one_hot = torch.zeros_like(probs).scatter_(1, logits.argmax(dim=-1, keepdim=True), 1.0)
        probs = torch.where(greedy.unsqueeze(1), one_hot, probs)
    return probs


def uniforms(generators: Sequence[torch.Generator | None], device: torch.device) -> torch.Tensor:
    """One U[0,1) draw per row from that row's own generator (rows without one get 0.5, unused)."""
    out = torch.full((len(generators),), 0.5, device=device)
    for i, gen in enumerate(generators):
        if gen is not None:
            out[i] = torch.rand((), generator=gen, device=device)
    return out


def draws(gen: torch.Generator, n: int) -> list[float]:
    """n uniforms from one request's generator, as a host list, in draw order: on the CPU `torch.rand(n)` is n
    draws of `torch.rand(())`, so drawing a round's uniforms at once takes the numbers one-by-one draws would."""
    return torch.rand(n, generator=gen, device=gen.device).tolist()


def host_uniforms(generators: Sequence[torch.Generator | None]) -> list[float]:
    """`uniforms` as a host list, for CPU generators (the same draws; a tensor write per row cost twice as much)."""
    return [draws(gen, 1)[0] if gen is not None else 0.5 for gen in generators]


def sample_from_probs(probs: torch.Tensor, generators: Sequence[torch.Generator | None]) -> torch.Tensor:
    """Inverse-CDF draw of one token per row, each row with its own generator; LongTensor `[n]`."""
    return inverse_cdf(probs, uniforms(generators, probs.device))


def inverse_cdf(probs: torch.Tensor, u: torch.Tensor) -> torch.Tensor:
    """The token of each row `[n, V]` (non-negative, any positive total) that the uniform `u[row]` picks."""
    cdf = torch.cumsum(probs, dim=-1)
    # Scale u by the row's total mass so float rounding in the cumulative sum can never push the
    # draw past the last token; clamp guards the (measure-zero) u*total == cdf[-1] case.
    target = (u * cdf[:, -1]).unsqueeze(1)
    ids = torch.searchsorted(cdf, target, right=True).squeeze(1)
    return ids.clamp_(max=probs.shape[1] - 1)


def greedy_ids(logits: torch.Tensor) -> torch.Tensor:
    """`logits.argmax(dim=-1)` (`ops.argmax`: the small-row kernel's for float32 CPU logits)."""
    return ops.argmax(logits)


def sample(
    logits: torch.Tensor,
    params: Sequence[SamplingParams],
    generators: Sequence[torch.Generator | None],
) -> torch.Tensor:
    """Next token per row: `LongTensor [n]` on the logits' device (no host sync here, but for float32 CPU
    logits of temperature-only rows, which the small-row kernel draws: the same uniforms and inverse CDF,
    without the [n, V] probability tensor; torch's ops took ~0.2 ms of a batch-8 step here)."""
    if all(p.greedy for p in params):
        return greedy_ids(logits)
    vocab = logits.shape[-1]
    temperatures = None
    if all(temperature_only(p, vocab) for p in params) and all(g is None or g.device.type == "cpu" for g in generators):
        temperatures = [0.0 if p.greedy else float(p.temperature) for p in params]

    def by_probs(u: list[float] | None) -> torch.Tensor:
        probs = probs_from_logits(logits, params)
        return sample_from_probs(probs, generators) if u is None else inverse_cdf(probs, torch.tensor(u))

    return ops.sample(logits, temperatures, lambda: host_uniforms(generators), by_probs)
