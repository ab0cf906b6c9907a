"""NgramDrafter (prompt lookup) on token lists: longest suffix match, most recent occurrence, periodic extension."""

from __future__ import annotations

import pytest

from specctl.engine.speculative.drafter import NgramDrafter


def brute_force(tokens: list[int], k: int, lo: int, hi: int) -> list[int]:
    """Reference: try suffix lengths hi..lo; latest earlier start i with tokens[i:i+n] == suffix."""
    n_tok = len(tokens)
    for n in range(min(hi, n_tok - 1), lo - 1, -1):
        suffix = tokens[n_tok - n :]
        for i in range(n_tok - n - 1, -1, -1):
            if tokens[i : i + n] == suffix:
                ext = list(tokens)
                out = []
                j = i + n
                while len(out) < k:
                    out.append(ext[j])
                    ext.append(ext[j])
                    j += 1
                return out
    return []


def test_longest_suffix_wins_over_more_recent_shorter_match() -> None:
    d = NgramDrafter(min_match=1, max_match=3)
    # Suffix [1, 2, 3] occurs at 0 (followed by 9); the shorter suffix [3] also occurs at 5 (followed by 7).
    toks = [1, 2, 3, 9, 8, 3, 7, 1, 2, 3]
    assert d.lookup(toks, 2) == [9, 8]


def test_most_recent_occurrence_and_periodic_extension() -> None:
    d = NgramDrafter(min_match=2, max_match=2)
    assert d.lookup([5, 6, 1, 5, 6, 2, 5, 6], 1) == [2]
    # A period-2 repetition proposes a full k tokens although only one token follows the match.
    assert d.lookup([4, 7, 4, 7, 4], 5) == [7, 4, 7, 4, 7]


def test_no_match_below_min_match() -> None:
    d = NgramDrafter(min_match=2, max_match=4)
    assert d.lookup([1, 2, 3, 4, 5, 3], 3) == []  # only a 1-token suffix recurs
    assert d.lookup([7], 3) == []
    assert d.lookup([1, 2, 1, 2], 0) == []


@pytest.mark.parametrize("seed", range(20))
def test_matches_brute_force(seed: int) -> None:
    import random

    rng = random.Random(seed)
    toks = [rng.randrange(4) for _ in range(rng.randrange(2, 60))]
    lo = rng.randrange(1, 3)
    hi = lo + rng.randrange(0, 4)
    k = rng.randrange(1, 8)
    assert NgramDrafter(min_match=lo, max_match=hi).lookup(toks, k) == brute_force(toks, k, lo, hi)


def test_invalid_match_bounds() -> None:
    with pytest.raises(ValueError):
        NgramDrafter(min_match=3, max_match=2)


@pytest.mark.parametrize("seed", range(10))
def test_incremental_index_follows_a_growing_request(seed: int) -> None:
    """`propose` keeps one index per request and feeds it only the new tokens; every step it must propose
    what a fresh scan of the whole request proposes, and `release` must forget the request."""
    import random

    import torch

    from specctl.engine.sampling_params import SamplingParams
    from specctl.engine.sequence import Sequence
    from specctl.engine.speculative.drafter import DraftBuffers

    rng = random.Random(seed)
    lo = rng.randrange(1, 3)
    hi = lo + rng.randrange(0, 3)
    d = NgramDrafter(min_match=lo, max_match=hi)
    seqs = [Sequence(rid, [rng.randrange(5) for _ in range(rng.randrange(1, 20))], SamplingParams(max_tokens=200))
            for rid in range(3)]
    k = 4
    buf = DraftBuffers(torch.zeros(3, k, dtype=torch.long), torch.zeros(3, dtype=torch.long), None)
    for _ in range(30):
        budgets = [rng.randrange(0, k + 1) for _ in seqs]
        d.propose(seqs, budgets, buf)
        for i, (seq, budget) in enumerate(zip(seqs, budgets, strict=True)):
            want = brute_force(seq.prompt_ids + seq.output_ids, budget, lo, hi) if budget else []
            assert buf.num_drafts[i].item() == len(want)
            assert buf.draft_tokens[i, : len(want)].tolist() == want
        for seq in seqs:  # a verify keeps 1..3 tokens
            for _ in range(rng.randrange(1, 4)):
                seq.output_ids.append(rng.randrange(5))
    d.release(0)
    assert 0 not in d._index and 1 in d._index
