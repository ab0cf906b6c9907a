"""Oracles for the hybrid model family: the cached serving path must equal the cache-free forward.

Every test builds a tiny random model (all three layer kinds) on disk and runs it through ModelRunner.
"""

from __future__ import annotations

import pytest
import torch

from specctl.engine.checkpoint import write_random_model
from specctl.engine.model import ssd_scan, ssd_step
from specctl.engine.model_runner import ForwardItem, ModelRunner

KINDS = ("mamba", "swa", "full", "swa", "mamba")
WINDOW = 6
PAGE = 4


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory):
    return write_random_model(tmp_path_factory.mktemp("tiny") / "hybrid", layer_kinds=KINDS, sliding_window=WINDOW)


def make_runner(model_dir, **kw) -> ModelRunner:
    args = dict(page_size=PAGE, max_tokens=512, max_requests=8, max_draft_tokens=3)
    args.update(kw)
    return ModelRunner(str(model_dir), **args)


def tokens(n: int, seed: int) -> list[int]:
    return torch.randint(0, 256, (n,), generator=torch.Generator().manual_seed(seed)).tolist()


def reference(runner: ModelRunner, ids: list[int]) -> torch.Tensor:
    with torch.no_grad():
        return runner.model(torch.tensor([ids])).float()[0]


def test_ssd_parallel_form_equals_recurrence():
    g = torch.Generator().manual_seed(1)
    b, n, h, p, s = 2, 150, 3, 4, 5  # 150 spans several 64-token chunks, the first one partial
    x = torch.randn(b, n, h, p, generator=g)
    dt = torch.rand(b, n, h, generator=g) * 0.5
    A = -torch.rand(h, generator=g) * 3
    bm, cm = torch.randn(b, n, s, generator=g), torch.randn(b, n, s, generator=g)
    h0 = torch.randn(b, h, p, s, generator=g)
    y, hn, tail = ssd_scan(x, dt, A, bm, cm, h0, keep=5)
    state, ys, states = h0, [], []
    for t in range(n):
        yt, state = ssd_step(x[:, t], dt[:, t], A, bm[:, t], cm[:, t], state)
        ys.append(yt)
        states.append(state)
    torch.testing.assert_close(y, torch.stack(ys, 1), rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(hn, state, rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(tail, torch.stack(states[-5:], 1), rtol=1e-4, atol=1e-4)


def test_token_by_token_decode_equals_full_forward(model_dir):
    runner = make_runner(model_dir)
    ids = tokens(3 * WINDOW + 5, seed=2)  # several pages, well past the window
    ref = reference(runner, ids)
    runner.allocate(7, 1)
    got = torch.cat([runner.forward([ForwardItem(7, [t], i)]) for i, t in enumerate(ids)])
    assert runner.cached_len(7) == len(ids)
    torch.testing.assert_close(got, ref, rtol=1e-4, atol=1e-4)
    # the context matters, so equality above is not vacuous
    assert (ref[-1] - reference(runner, ids[-3:])[-1]).abs().max() > 1e-2


@pytest.mark.parametrize("cuts", [(0, 11, 14, 23), (0, 2, 9, 10, 23), (0, 23)])
def test_chunked_prefill_equals_full_forward(model_dir, cuts):
    runner = make_runner(model_dir)
    ids = tokens(23, seed=3)
    runner.allocate(1, 4)
    parts = [runner.forward([ForwardItem(1, ids[a:b], a)]) for a, b in zip(cuts[:-1], cuts[1:], strict=True)]
    torch.testing.assert_close(torch.cat(parts), reference(runner, ids), rtol=1e-4, atol=1e-4)


def test_batch_of_different_lengths_equals_each_alone(model_dir):
    runner = make_runner(model_dir)
    seqs = {1: tokens(17, 4), 2: tokens(5, 5), 3: tokens(30, 6), 4: tokens(9, 7)}
    refs = {rid: reference(runner, s) for rid, s in seqs.items()}
    for rid in seqs:
        runner.allocate(rid, 1)
    # step 1: prompts of different lengths (long and short) in one call
    pos = {1: 10, 2: 3, 3: 12, 4: 2}
    out = runner.forward([ForwardItem(rid, seqs[rid][: pos[rid]], 0) for rid in seqs])
    off = 0
    for rid in seqs:
        torch.testing.assert_close(out[off : off + pos[rid]], refs[rid][: pos[rid]], rtol=1e-4, atol=1e-4)
        off += pos[rid]
    # then mixed decode (1 token) and verify-sized (3 tokens) items until every sequence ends
    while any(pos[r] < len(seqs[r]) for r in seqs):
        items = []
        for rid in seqs:
            if pos[rid] < len(seqs[rid]):
                n = 3 if rid % 2 else 1
                items.append(ForwardItem(rid, seqs[rid][pos[rid] : pos[rid] + n], pos[rid]))
        out = runner.forward(items)
        off = 0
        for it in items:
            n = len(it.token_ids)
            torch.testing.assert_close(out[off : off + n], refs[it.rid][it.start_pos : it.start_pos + n],
                                       rtol=1e-4, atol=1e-4)
            off += n
            pos[it.rid] += n
            if pos[it.rid] >= len(seqs[it.rid]):
                runner.free(it.rid)  # leaving mid-way must not disturb the others


def test_bfloat16_runs_and_stays_close(model_dir):
    runner = make_runner(model_dir, dtype="bfloat16")
    ids = tokens(12, 8)
    runner.allocate(1, 12)
    out = torch.cat([runner.forward([ForwardItem(1, ids[:8], 0)]), runner.forward([ForwardItem(1, ids[8:], 8)])])
    assert out.dtype == torch.float32
    ref = reference(make_runner(model_dir), ids)
    assert (out - ref).abs().max() < 0.1 * ref.abs().max()
