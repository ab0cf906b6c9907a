"""The verification maths alone (engine/speculative/verify.py), on synthetic distributions.

Greedy: checked against a straightforward per-request loop. Sampling: chi-square goodness-of-fit of the
emitted tokens against the target distribution at significance level ALPHA = 0.001 with fixed seeds, for a
good drafter, a deliberately wrong drafter and a deterministic (point-mass) drafter; plus the negative
control that the *draft* distribution is rejected by the same test (so the test can fail).
"""

from __future__ import annotations

import torch

from specctl.engine.speculative.verify import greedy_accept, rejection_accept

from spec_support import ALPHA, chi_square_pvalue  # isort: skip


def reference_greedy(drafts: list[int], logits: torch.Tensor) -> list[int]:
    out = []
    for j, d in enumerate(drafts):
        t = int(logits[j].argmax())
        if t != d:
            out.append(t)
            return out
        out.append(d)
    out.append(int(logits[len(drafts)].argmax()))
    return out


def greedy_case(seed: int, b: int = 64, k: int = 5, v: int = 7) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(target logits [b, k+1, v], drafts [b, k], num_drafts [b]) with long accepted prefixes common: the
    argmax copied for a random prefix length, then maybe broken."""
    g = torch.Generator().manual_seed(seed)
    logits = torch.randn(b, k + 1, v, generator=g)
    argmax = logits.argmax(-1)
    drafts = torch.randint(0, v, (b, k), generator=g)
    for i in range(b):
        n = int(torch.randint(0, k + 1, (1,), generator=g))
        drafts[i, :n] = argmax[i, :n]
    return logits, drafts, torch.randint(0, k + 1, (b,), generator=g)


def test_greedy_accept_matches_reference_loop() -> None:
    logits, drafts, num = greedy_case(0)
    b = logits.shape[0]
    accepted, tokens = greedy_accept(drafts.tolist(), num.tolist(), logits.argmax(-1).tolist())
    for i in range(b):
        ref = reference_greedy(drafts[i, : int(num[i])].tolist(), logits[i])
        assert accepted[i] == len(ref) - 1
        assert tokens[i] == ref
    assert len(set(accepted)) >= 4  # the batch really mixes different accept lengths


def test_greedy_accept_zero_drafts_is_plain_argmax() -> None:
    logits = torch.randn(3, 1, 11)
    accepted, tokens = greedy_accept([[], [], []], [0, 0, 0], logits.argmax(-1).tolist())
    assert accepted == [0, 0, 0]
    assert tokens == [[t] for t in logits[:, 0].argmax(-1).tolist()]


def _run_rejection(p: torch.Tensor, q: torch.Tensor | None, trials: int, seed: int):
    """Draft K tokens from q (or the point masses of `fixed`), verify against p; return per-position samples."""
    k = p.shape[0] - 1
    g = torch.Generator().manual_seed(seed)
    pb = p.unsqueeze(0).expand(trials, -1, -1)
    if q is None:
        # Deterministic drafter: always proposes token 0 (which the target dislikes) at every position.
        drafts = torch.zeros(trials, k, dtype=torch.long)
        qb = None
    else:
        drafts = torch.multinomial(q.repeat(trials, 1), 1, replacement=True, generator=g).view(trials, k)
        qb = q.unsqueeze(0).expand(trials, -1, -1)
    acc, toks = rejection_accept(drafts.tolist(), [k] * trials, pb, qb, [g] * trials)
    tokens = torch.full((trials, k + 1), -1, dtype=torch.long)
    for i, row in enumerate(toks):
        tokens[i, : len(row)] = torch.tensor(row)
    return torch.tensor(acc), tokens


def _distributions(v: int, k: int, seed: int, sharp: float) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    p = torch.softmax(torch.randn(k + 1, v, generator=g) * sharp, -1)
    q = torch.softmax(torch.randn(k, v, generator=g) * sharp, -1)
    return p, q


def _check_positions(p: torch.Tensor, accepted: torch.Tensor, tokens: torch.Tensor) -> None:
    v = p.shape[1]
    k = p.shape[0] - 1
    # Token at position j exists when the first j drafts were accepted; given that, it must follow p_j
    # (the synthetic target is context-free, so p_j is also the conditional distribution).
    for j in range(k + 1):
        rows = accepted >= j
        if j > 1 and int(rows.sum()) < 200:
            continue  # too few samples reach this deep for a meaningful test (wrong drafter)
        assert int(rows.sum()) >= 200
        counts = torch.bincount(tokens[rows, j], minlength=v)
        pval = chi_square_pvalue(counts, p[j])
        assert pval > ALPHA, f"position {j}: p-value {pval:.2e} rejects the target distribution"


def test_rejection_sampling_follows_target_with_good_drafter() -> None:
    v, k = 8, 3
    p, q = _distributions(v, k, seed=1, sharp=1.0)
    q = 0.7 * p[:k] + 0.3 * q  # a decent drafter: close to the target
    accepted, tokens = _run_rejection(p, q, trials=10000, seed=2)
    assert accepted.float().mean() > 1.5  # it mostly agrees
    _check_positions(p, accepted, tokens)


def test_rejection_sampling_follows_target_with_wrong_drafter() -> None:
    v, k = 8, 3
    p, _ = _distributions(v, k, seed=3, sharp=1.5)
    # Deliberately wrong: the drafter puts most of its mass where the target puts least.
    q = torch.softmax(-1.0 * torch.log(p[:k]), -1)  # q ∝ 1/p
    accepted, tokens = _run_rejection(p, q, trials=10000, seed=4)
    assert accepted.float().mean() < 0.5
    _check_positions(p, accepted, tokens)


def test_rejection_sampling_with_point_mass_drafter() -> None:
    v, k = 6, 2
    p, _ = _distributions(v, k, seed=5, sharp=0.5)
    accepted, tokens = _run_rejection(p, None, trials=10000, seed=6)
    # A point-mass draft on token 0 is accepted with probability p_j(0).
    assert abs(float((accepted >= 1).float().mean()) - float(p[0, 0])) < 0.02
    _check_positions(p, accepted, tokens)


def test_chi_square_detects_the_draft_distribution() -> None:
    """Negative control: naively emitting the drafts (no rejection) is caught by the same test."""
    v, k = 8, 3
    p, q = _distributions(v, k, seed=7, sharp=1.0)
    g = torch.Generator().manual_seed(8)
    drafts = torch.multinomial(q[0], 20000, replacement=True, generator=g)
    assert chi_square_pvalue(torch.bincount(drafts, minlength=v), p[0]) < ALPHA


def test_rejection_sampling_is_reproducible_per_request() -> None:
    v, k = 8, 4
    p, q = _distributions(v, k, seed=9, sharp=1.0)
    drafts = torch.multinomial(q, 1, generator=torch.Generator().manual_seed(1)).view(1, k)

    def run(batch_pad: int) -> list[int]:
        # The same request alone and as row 0 of a bigger batch with other generators: identical output.
        gens = [torch.Generator().manual_seed(42)] + [torch.Generator().manual_seed(i) for i in range(batch_pad)]
        pb = p.unsqueeze(0).expand(1 + batch_pad, -1, -1)
        qb = q.unsqueeze(0).expand(1 + batch_pad, -1, -1)
        _, t = rejection_accept(drafts.expand(1 + batch_pad, -1).tolist(), [k] * (1 + batch_pad), pb, qb, gens)
        return t[0]

    assert run(0) == run(5)
