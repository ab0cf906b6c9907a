"""Verification of drafted tokens: which drafts the target accepts, and the one token it adds.

The contract, for a batch of B requests where request b drafted `n_b <= K` tokens d_1..d_{n_b} after its
last committed token x_0, and the target scored the n_b + 1 positions x_0, d_1, .., d_{n_b} in one forward:

- row j of the target's output (j = 0..n_b) is the target's distribution for the token that follows
  x_0, d_1, .., d_j, so row j judges draft d_{j+1} and row n_b yields the "bonus" token;
- each request gets back `accepted_b` (0..n_b) drafts plus exactly one token chosen by the target, so
  every verify step makes progress even when every draft is wrong;
- greedy (`greedy_accept`): the output is token for token what plain greedy decoding would produce;
- sampling (`rejection_accept`): standard speculative (rejection) sampling (Leviathan et al. 2023,
  Chen et al. 2023): the output tokens follow the target distribution exactly, whatever the drafter.

Drafts and counts are host lists (the decoder has them there anyway); target probabilities are
`[B, K + 1, V]`, draft probabilities `[B, K, V]` or None for a deterministic drafter (n-gram lookup: q is
a point mass on the proposed token). Results are per request the accepted count and the new tokens.
Randomness comes only from the per-request `torch.Generator`s, so a seeded request is reproducible
whatever batch it runs in. Both work on host lists because at serving sizes a batched tensor form is
dozens of small ops that cost more than the comparisons (benchmarks/RESULTS.md).

This module knows nothing about caches, drafters or scheduling: it is the maths only.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch

from specctl.engine import ops
from specctl.engine.sampling import draws, inverse_cdf


def greedy_accept(
    drafts: Sequence[Sequence[int]], num_drafts: Sequence[int], target_argmax: Sequence[Sequence[int]]
) -> tuple[list[int], list[list[int]]]:
    """Greedy acceptance: per request, the longest prefix where draft == target argmax, plus the target's own
    next token. `target_argmax[b]` holds the argmax of rows 0..n_b.

    Row j's argmax is exactly the token plain greedy decoding would emit after x_0, d_1..d_j; so while
    the drafts agree with it we are reproducing greedy decoding, and at the first disagreement (or after
    the last draft) the argmax of that row is the token greedy decoding emits next."""
    accepted: list[int] = []
    tokens: list[list[int]] = []
    for d, n, am in zip(drafts, num_drafts, target_argmax, strict=True):
        a = 0
        while a < n and d[a] == am[a]:
            a += 1
        accepted.append(a)
        tokens.append([*d[:a], am[a]])
    return accepted, tokens


def rejection_accept(
    drafts: Sequence[Sequence[int]],
    num_drafts: Sequence[int],
    target_probs: torch.Tensor,
    draft_probs: torch.Tensor | None,
    generators: Sequence[torch.Generator | None],
) -> tuple[list[int], list[list[int]]]:
    """Speculative (rejection) sampling: per request, the accepted drafts count and its new tokens (the
    accepted drafts, then one token from the residual or the bonus row), distributed exactly as the target's.

    For each draft d_j ~ q_j (q_j = the drafter's distribution at that position; a point mass when
    `draft_probs` is None), with p_j the target's distribution at the same position:

      accept d_j with probability min(1, p_j(d_j) / q_j(d_j));
      on the first rejection, emit a token from the residual r = normalize(max(0, p_j - q_j)) and stop;
      if all n drafts are accepted, emit a bonus token from p_{n+1}.

    Why this is exact: P(emit x at j) = q(x) min(1, p(x)/q(x)) + P(reject) r(x)
    = min(q(x), p(x)) + (1 - sum_y min(q(y), p(y))) * max(0, p(x) - q(x)) / sum_y max(0, p(y) - q(y)),
    and since sum_y min(q, p) = 1 - sum_y max(0, p - q), this is min(q(x), p(x)) + max(0, p(x) - q(x)) = p(x).
    A wrong drafter therefore only costs acceptance, never correctness.

    Each request draws n uniforms, then its one inverse-CDF uniform, from its own generator, in one call
    (`torch.rand(n + 1)` yields exactly `torch.rand(n)` then `torch.rand(())`, the order a one-request
    loop draws in). The accept probabilities come to the host in one gather, and the residuals of all
    requests are formed, normalised and sampled as one [b, V] block."""
    b, k1, v = target_probs.shape
    dev = target_probs.device
    flat_p = target_probs.reshape(b * k1, v)
    nd = list(num_drafts)
    # (request, position, draft) of every real draft, request-major: p_j(d_j) and q_j(d_j) in one gather each
    cells = [(i, j, drafts[i][j]) for i in range(b) for j in range(nd[i])]
    accept_prob: list[float] = []
    if cells:
        p_at = flat_p.reshape(-1)[torch.tensor([(i * k1 + j) * v + d for i, j, d in cells], device=dev)]
        if draft_probs is not None:
            k = k1 - 1
            q_at = draft_probs.reshape(-1)[torch.tensor([(i * k + j) * v + d for i, j, d in cells], device=dev)]
            # min(1, p/q) in the probabilities' dtype; q(d) > 0 because d was drawn from q (the clamp guards 0)
            p_at = (p_at / q_at.clamp(min=1e-30)).clamp(max=1.0)
        accept_prob = p_at.tolist()
    accepted: list[int] = []
    finals: list[float] = []  # the uniform of each request's one draw from its own generator
    rows: list[int] = []  # the row each request's token is drawn from
    rejected: list[int] = []  # requests whose token comes from a residual
    pos = 0
    for i in range(b):
        n = nd[i]
        gen = generators[i] if i < len(generators) else None
        if gen is None:
            # no generator (a greedy row): the drafts' uniforms come from the global stream and the final draw
            # uses 0.5, as `sampling.uniforms` does
            u = [*(torch.rand(n, device=dev).tolist() if n else []), 0.5]
        else:
            u = draws(gen, n + 1)
        a = 0
        while a < n and u[a] < accept_prob[pos + a]:
            a += 1
        pos += n
        accepted.append(a)
        finals.append(u[n])
        rows.append(i * k1 + a)
        if a < n:
            rejected.append(i)
    dist = flat_p.index_select(0, torch.tensor(rows, dtype=torch.long, device=dev))  # [b, V]
    if rejected:
        rej = torch.tensor(rejected, dtype=torch.long, device=dev)
        if draft_probs is None:
            # p - onehot(d), clamped at 0: p with the draft's entry zeroed (p(d) - 1 <= 0), the rest unchanged
            toks = torch.tensor([drafts[i][accepted[i]] for i in rejected], dtype=torch.long, device=dev)
            residual = dist[rej].index_put_((torch.arange(len(rejected), device=dev), toks),
                                            torch.zeros((), dtype=dist.dtype, device=dev))
        else:
            qrows = torch.tensor([i * (k1 - 1) + accepted[i] for i in rejected], dtype=torch.long, device=dev)
            residual = (dist[rej] - draft_probs.reshape(b * (k1 - 1), v).index_select(0, qrows)).clamp(min=0.0)
        total = residual.sum(dim=-1, keepdim=True)
        # Exact arithmetic never reaches total == 0 at a rejection (that needs p <= q everywhere, i.e. p == q,
        # where the accept probability is 1); float rounding can, and then p itself is correct.
        dist.index_copy_(0, rej, torch.where(total > 0.0, residual / total.clamp(min=1e-30), dist[rej]))
    ids = inverse_cdf(dist, torch.tensor(finals, dtype=dist.dtype, device=dev)).tolist()
    return accepted, [[*drafts[i][: accepted[i]], ids[i]] for i in range(b)]


def rejection_accept_logits(
    drafts: Sequence[Sequence[int]],
    num_drafts: Sequence[int],
    target_logits: torch.Tensor,
    temperatures: Sequence[float],
    draft_probs: torch.Tensor | None,
    generators: Sequence[torch.Generator],
    by_probs: Callable[[], tuple[list[int], list[list[int]]]],
) -> tuple[list[int], list[list[int]]]:
    """`rejection_accept` for rows sampled at a temperature alone (no top-k / top-p), from the target's logits
    [B, K + 1, V] rather than its probabilities: in the small-row kernel where it applies (`ops.rejection`),
    which per request normalises only the positions it reads and tests, forms the residual and draws, in one
    call (at batch 8, 3 drafts: the probabilities and `rejection_accept` took ~0.2 ms a verify in torch);
    elsewhere `by_probs()`, the caller's `rejection_accept` over the probabilities. Each request draws its
    n + 1 uniforms from its own generator as `rejection_accept` does, so both accept and emit alike (to
    float32 rounding of the softmax)."""
    nd = list(num_drafts)
    return ops.rejection(target_logits, temperatures, drafts, nd, draft_probs,
                         lambda: [draws(g, n + 1) for n, g in zip(nd, generators, strict=True)], by_probs)
