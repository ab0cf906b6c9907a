"""Verification of drafted tokens: which drafts the target accepts, and the one token it adds.

The contract, for a batch of B requests where request b drafted `n_b <= K` tokens d_1..d_{n_b} after its
last committed token x_0, and the target scored the n_b + 1 positions x_0, d_1, .., d_{n_b} in one forward:

- row j of the target's output (j = 0..n_b) is the target's distribution for the token that follows
  x_0, d_1, .., d_j, so row j judges draft d_{j+1} and row n_b yields the "bonus" token;
- each request gets back `accepted_b` (0..n_b) drafts plus exactly one token chosen by the target, so
  every verify step makes progress even when every draft is wrong;
- greedy (`greedy_verify`): the output is token for token what plain greedy decoding would produce;
- sampling (`rejection_verify`): standard speculative (rejection) sampling (Leviathan et al. 2023,
  Chen et al. 2023): the output tokens follow the target distribution exactly, whatever the drafter.

Tensors: draft tokens `[B, K]` (entries past n_b are ignored), `num_drafts` `[B]`, target logits or
probabilities `[B, K + 1, V]`, draft probabilities `[B, K, V]` or None for a deterministic drafter
(n-gram lookup: q is a point mass on the proposed token). Results are `accepted [B]` and `tokens
[B, K + 1]` where `tokens[b, :accepted[b] + 1]` are request b's new tokens. Randomness comes only from
the per-request `torch.Generator`s, so a seeded request is reproducible whatever batch it runs in.

This module knows nothing about caches, drafters or scheduling: it is the maths only.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from specctl.engine.sampling import sample_from_probs


def _valid_mask(num_drafts: torch.Tensor, k: int) -> torch.Tensor:
    """[B, K] bool: position j < n_b holds a real draft."""
    return torch.arange(k, device=num_drafts.device).unsqueeze(0) < num_drafts.unsqueeze(1)


def greedy_verify(
    draft_tokens: torch.Tensor,
    num_drafts: torch.Tensor,
    target_logits: torch.Tensor,
    *,
    out_tokens: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Greedy acceptance: the longest prefix where draft == target argmax, plus the target's own next token.

    Row j's argmax is exactly the token plain greedy decoding would emit after x_0, d_1..d_j; so while
    the drafts agree with it we are reproducing greedy decoding, and at the first disagreement (or after
    the last draft) the argmax of that row is the token greedy decoding emits next.
    `out_tokens` ([B, K + 1] long, optional) is a preallocated result buffer (written, and returned).
    """
    b, k = draft_tokens.shape
    target_argmax = target_logits.argmax(dim=-1)  # [B, K+1]
    if k == 0:
        accepted = torch.zeros(b, dtype=torch.long, device=target_logits.device)
    else:
        match = (draft_tokens == target_argmax[:, :k]) & _valid_mask(num_drafts, k)
        # cumprod turns [1, 1, 0, 1] into [1, 1, 0, 0]: only the unbroken prefix of matches counts.
        accepted = match.long().cumprod(dim=1).sum(dim=1)
    tokens = out_tokens if out_tokens is not None else torch.empty_like(target_argmax)
    if k:
        tokens[:, :k] = draft_tokens
    # The bonus/correction: the target's argmax right after the accepted prefix.
    tokens.scatter_(1, accepted.unsqueeze(1), target_argmax.gather(1, accepted.unsqueeze(1)))
    return accepted, tokens


def greedy_accept(
    drafts: Sequence[Sequence[int]], num_drafts: Sequence[int], target_argmax: Sequence[Sequence[int]]
) -> tuple[list[int], list[list[int]]]:
    """`greedy_verify` on host lists: per request, the accepted drafts count and its new tokens (the accepted
    drafts, then the target's argmax after them). `target_argmax[b]` holds the argmax of rows 0..n_b.

    Same rule, no tensors: once the argmax is on the host (one copy per verify, needed anyway to hand the
    tokens to the engine), comparing a few drafts per request in Python costs less than the dozen small
    tensor ops of the batched form, which at batch 1 took more time than the comparison itself."""
    accepted: list[int] = []
    tokens: list[list[int]] = []
    for d, n, am in zip(drafts, num_drafts, target_argmax, strict=True):
        a = 0
        while a < n and d[a] == am[a]:
            a += 1
        accepted.append(a)
        tokens.append([*d[:a], am[a]])
    return accepted, tokens


def rejection_verify(
    draft_tokens: torch.Tensor,
    num_drafts: torch.Tensor,
    target_probs: torch.Tensor,
    draft_probs: torch.Tensor | None,
    generators: Sequence[torch.Generator | None],
    *,
    out_tokens: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Speculative (rejection) sampling: the new tokens are distributed exactly as the target's.

    For each draft d_j ~ q_j (q_j = the drafter's distribution at that position; a point mass when
    `draft_probs` is None), with p_j the target's distribution at the same position:

      accept d_j with probability min(1, p_j(d_j) / q_j(d_j));
      on the first rejection, emit a token from the residual r = normalize(max(0, p_j - q_j)) and stop;
      if all n drafts are accepted, emit a bonus token from p_{n+1}.

    Why this is exact: P(emit x at j) = q(x) min(1, p(x)/q(x)) + P(reject) r(x)
    = min(q(x), p(x)) + (1 - sum_y min(q(y), p(y))) * max(0, p(x) - q(x)) / sum_y max(0, p(y) - q(y)),
    and since sum_y min(q, p) = 1 - sum_y max(0, p - q), this is min(q(x), p(x)) + max(0, p(x) - q(x)) = p(x).
    A wrong drafter therefore only costs acceptance, never correctness.
    """
    b, k1, _v = target_probs.shape
    k = k1 - 1
    dev = target_probs.device
    tokens = out_tokens if out_tokens is not None else torch.empty(b, k1, dtype=torch.long, device=dev)
    nd = num_drafts.tolist()
    acc = [0] * b
    if k:
        tokens[:, :k] = draft_tokens
        safe_drafts = draft_tokens.clamp(min=0)
        # p_j(d_j) and q_j(d_j) for every draft position at once.
        p_at_draft = target_probs[:, :k, :].gather(2, safe_drafts.unsqueeze(2)).squeeze(2)  # [B, K]
        if draft_probs is None:
            q_at_draft = torch.ones_like(p_at_draft)
        else:
            q_at_draft = draft_probs.gather(2, safe_drafts.unsqueeze(2)).squeeze(2)
        # min(1, p/q); q(d) > 0 because d was drawn from q (the clamp only guards padding).
        accept_prob = (p_at_draft / q_at_draft.clamp(min=1e-30)).clamp(max=1.0).tolist()
        for i in range(b):
            n = nd[i]
            if not n:
                continue
            gen = generators[i] if i < len(generators) else None
            # One uniform per draft, drawn up front from the request's own generator (reproducible).
            u = torch.rand(n, generator=gen, device=_gen_device(gen, target_probs)).tolist()
            a = 0
            while a < n and u[a] < accept_prob[i][a]:
                a += 1
            acc[i] = a
    accepted = torch.tensor(acc, dtype=torch.long, device=dev)
    rows = torch.arange(b, device=dev)
    # The distribution of each request's one target-chosen token, all rows at once: at the first
    # rejected position j = a the residual normalize(max(0, p_j - q_j)); after all n accepted, p_{n+1}
    # (row n of the target's output, which is where a == n points too).
    p = target_probs[rows, accepted]  # [B, V]
    rejected = accepted < torch.tensor(nd, dtype=torch.long, device=dev)
    if bool(rejected.any()):
        j = accepted.clamp(max=max(k - 1, 0))
        if draft_probs is None:
            q = torch.zeros_like(p).scatter_(1, draft_tokens[rows, j].clamp(min=0).unsqueeze(1), 1.0)  # p - onehot(d)
        else:
            q = draft_probs[rows, j]
        residual = (p - q).clamp(min=0.0)
        total = residual.sum(dim=-1, keepdim=True)
        # Exact arithmetic never reaches total == 0 at a rejection (that needs p <= q everywhere, i.e.
        # p == q, where the accept probability is 1); float rounding can, and then p itself is correct.
        use = rejected.unsqueeze(1) & (total > 0.0)
        dist = torch.where(use, residual / total.clamp(min=1e-30), p)
    else:
        dist = p
    # One draw per request from its own generator, after its uniforms: the same draws as one at a time.
    gens = [generators[i] if i < len(generators) else None for i in range(b)]
    tokens.scatter_(1, accepted.unsqueeze(1), sample_from_probs(dist, gens).unsqueeze(1))
    return accepted, tokens


def rejection_accept(
    drafts: Sequence[Sequence[int]],
    num_drafts: Sequence[int],
    target_probs: torch.Tensor,
    draft_probs: torch.Tensor | None,
    generators: Sequence[torch.Generator | None],
) -> tuple[list[int], list[list[int]]]:
    """`rejection_verify` on host lists, with the same draws: per request, the accepted drafts count and
    its new tokens (the accepted drafts, then the one token drawn from the residual or the bonus row).

    The same rule and the same random numbers (each request's n uniforms, then its one inverse-CDF draw,
    from its own generator: `torch.rand(n + 1)` yields exactly `torch.rand(n)` then `torch.rand(())`), so
    a seeded request emits what `rejection_verify` emits, token for token. What differs is the op count:
    the accept probabilities come to the host in one gather, each request draws its uniforms in one call,
    and the residuals of all requests are formed, normalised and sampled as one [b, V] block: at vocab 260
    on the 2-core CPU, 43 vs 65 us at batch 1 and 67 vs 103 us at batch 8, where the arithmetic is a few."""
    b, k1, v = target_probs.shape
    dev = target_probs.device
    flat_p = target_probs.reshape(b * k1, v)
    nd = list(num_drafts)
    # p_j(d_j) (and q_j(d_j)) of every real draft, flattened request-major
    at = [(i * k1 + j) * v + drafts[i][j] for i in range(b) for j in range(nd[i])]
    accept_prob: list[float] = []
    if at:
        p_at = flat_p.reshape(-1)[torch.tensor(at, dtype=torch.long, device=dev)]
        if draft_probs is not None:
            k = k1 - 1
            q_idx = [(i * k + j) * v + drafts[i][j] for i in range(b) for j in range(nd[i])]
            q_at = draft_probs.reshape(-1)[torch.tensor(q_idx, dtype=torch.long, device=dev)]
            # min(1, p/q) in the dtype rejection_verify computes it in, so both accept the same drafts
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
            u = torch.rand(n + 1, generator=gen, device=gen.device).tolist()
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
        # float rounding can leave no residual mass (see rejection_verify): then p itself is right
        dist.index_copy_(0, rej, torch.where(total > 0.0, residual / total.clamp(min=1e-30), dist[rej]))
    u_t = torch.tensor(finals, dtype=dist.dtype, device=dev)
    cdf = torch.cumsum(dist, dim=-1)
    ids = torch.searchsorted(cdf, (u_t * cdf[:, -1]).unsqueeze(1), right=True).squeeze(1).clamp_(max=v - 1).tolist()
    return accepted, [[*drafts[i][: accepted[i]], ids[i]] for i in range(b)]


def _gen_device(gen: torch.Generator | None, like: torch.Tensor) -> torch.device:
    return gen.device if gen is not None else like.device
