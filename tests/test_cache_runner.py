"""Cache oracles: rollback (speculative verify), export/import, pool exhaustion, layout facts."""

from __future__ import annotations

import pytest
import torch

from specctl.engine.checkpoint import write_random_model
from specctl.engine.model import LONE_SHORT
from specctl.engine.model_runner import ForwardItem, ModelRunner
from specctl.engine.speculative.drafter import ModelDrafter
from specctl.errors import RuntimeFailure

from spec_support import spy_chain_draws  # isort: skip

KINDS = ("mamba", "swa", "full", "swa", "mamba")
WINDOW = 6


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory):
    return write_random_model(tmp_path_factory.mktemp("tiny") / "hybrid", layer_kinds=KINDS, sliding_window=WINDOW)


def make_runner(model_dir, **kw) -> ModelRunner:
    args = dict(page_size=4, max_tokens=512, max_requests=8, max_draft_tokens=4)
    args.update(kw)
    return ModelRunner(str(model_dir), **args)


def tokens(n: int, seed: int) -> list[int]:
    return torch.randint(0, 256, (n,), generator=torch.Generator().manual_seed(seed)).tolist()


@pytest.mark.parametrize("accepted", [0, 1, 3, 5])
def test_verify_then_truncate_equals_feeding_only_accepted(model_dir, accepted):
    """A 5-token verify forward rolled back to `accepted` tokens leaves exactly the caches that feeding
    those tokens alone would leave: the next forward's logits agree (mamba, swa and full layers)."""
    prompt, draft, after = tokens(11, 1), tokens(5, 2), tokens(8, 3)  # 11 + 5 > window: swa must roll back
    a, b = make_runner(model_dir), make_runner(model_dir)
    for r in (a, b):
        r.allocate(1, len(prompt))
        r.forward([ForwardItem(1, prompt, 0)])
    a.forward([ForwardItem(1, draft, len(prompt))])  # verify: writes all 5 positions
    a.truncate(1, len(prompt) + accepted)
    if accepted:
        b.forward([ForwardItem(1, draft[:accepted], len(prompt))])
    n = len(prompt) + accepted
    assert a.cached_len(1) == b.cached_len(1) == n
    # continue both, one multi-token step then single tokens, and compare every logit
    la = [a.forward([ForwardItem(1, after[:3], n)])] + [a.forward([ForwardItem(1, [t], n + 3 + i)])
                                                        for i, t in enumerate(after[3:])]
    lb = [b.forward([ForwardItem(1, after[:3], n)])] + [b.forward([ForwardItem(1, [t], n + 3 + i)])
                                                        for i, t in enumerate(after[3:])]
    torch.testing.assert_close(torch.cat(la), torch.cat(lb), rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("kinds", [KINDS, ("mamba", "swa", "full", "swa")])  # the last layer mamba, then swa
def test_last_only_gives_each_items_last_logits_and_caches_every_position(tmp_path, kinds):
    """`forward(items, last_only=True)` (a prefill: the last layer's output projection and MLP and the
    lm_head run for each item's last position alone) gives the logits `forward` gives those positions,
    and leaves the caches it leaves: a long prompt grouped alone, short items padded together, a chunk
    continuing a cached prefix."""
    path = write_random_model(tmp_path / "m", layer_kinds=kinds, sliding_window=WINDOW)
    a, b = make_runner(path), make_runner(path)
    for r in (a, b):
        for rid in (1, 2, 3, 4):
            r.allocate(rid, 64)
        r.forward([ForwardItem(4, tokens(9, 20), 0)])
    items = [ForwardItem(1, tokens(23, 21), 0), ForwardItem(2, tokens(2, 22), 0), ForwardItem(3, tokens(4, 23), 0),
             ForwardItem(4, tokens(11, 24), 9)]
    got = a.forward(items, last_only=True)
    full = b.forward(items)
    ends = torch.tensor([len(it.token_ids) for it in items]).cumsum(0) - 1
    assert got.shape == (len(items), full.shape[1])
    torch.testing.assert_close(got, full[ends], rtol=1e-5, atol=1e-5)
    nxt = [ForwardItem(it.rid, [7], a.cached_len(it.rid)) for it in items]
    assert [a.cached_len(it.rid) for it in items] == [b.cached_len(it.rid) for it in items] == [23, 2, 4, 20]
    torch.testing.assert_close(a.forward(nxt), b.forward(nxt), rtol=1e-5, atol=1e-5)
    one = a.forward([ForwardItem(1, [9, 8, 7], 24)], last_only=True)  # one item, one group: no gather
    torch.testing.assert_close(one, b.forward([ForwardItem(1, [9, 8, 7], 24)])[-1:], rtol=1e-5, atol=1e-5)


def test_truncate_in_a_batched_verify_and_repeated_rollbacks(model_dir):
    a, b = make_runner(model_dir), make_runner(model_dir)
    prompts = {1: tokens(9, 4), 2: tokens(3, 5)}
    for r in (a, b):
        for rid, p in prompts.items():
            r.allocate(rid, len(p))
        r.forward([ForwardItem(rid, p, 0) for rid, p in prompts.items()])
    accepted = {1: 2, 2: 0}
    for rnd in range(3):  # several verify rounds in a row
        drafts = {rid: tokens(4, 10 * rnd + rid) for rid in prompts}
        a.forward([ForwardItem(rid, d, a.cached_len(rid)) for rid, d in drafts.items()])
        for rid, d in drafts.items():
            keep = a.cached_len(rid) - len(d) + accepted[rid] + 1
            a.truncate(rid, keep)
            b.forward([ForwardItem(rid, d[: accepted[rid] + 1], b.cached_len(rid))])
            assert a.cached_len(rid) == b.cached_len(rid)
    items = [ForwardItem(rid, [65], a.cached_len(rid)) for rid in prompts]
    torch.testing.assert_close(a.forward(items), b.forward(items), rtol=1e-4, atol=1e-4)


def test_truncate_outside_the_last_forward_is_refused(model_dir):
    r = make_runner(model_dir)
    r.allocate(1, 20)
    r.forward([ForwardItem(1, tokens(12, 6), 0)])
    r.forward([ForwardItem(1, tokens(3, 7), 12)])
    with pytest.raises(RuntimeFailure, match="restorable lengths are 12..15"):
        r.truncate(1, 11)
    r.truncate(1, 12)
    assert r.cached_len(1) == 12


@pytest.mark.parametrize("prompt_len", [3, 14])  # shorter and longer than the window
def test_export_import_round_trip_gives_identical_next_logits(model_dir, prompt_len):
    src = make_runner(model_dir)
    dst = make_runner(model_dir, max_draft_tokens=1)  # decode may speculate less deeply than prefill
    prompt = tokens(prompt_len, 8)
    src.allocate(3, len(prompt))
    src.forward([ForwardItem(3, prompt, 0)])
    tensors = src.export_request(3)
    assert set(tensors) == {"kv", "swa", "mamba_conv", "mamba_ssm"}
    dst.allocate(99, 1)  # another request already on the decode side
    dst.forward([ForwardItem(99, tokens(5, 9), 0)])
    dst.import_request(5, {k: v.clone() for k, v in tensors.items()}, len(prompt))
    assert dst.cached_len(5) == len(prompt)
    cont = tokens(6, 10)
    la = torch.cat([src.forward([ForwardItem(3, [t], len(prompt) + i)]) for i, t in enumerate(cont)])
    lb = torch.cat([dst.forward([ForwardItem(5, [t], len(prompt) + i)]) for i, t in enumerate(cont)])
    torch.testing.assert_close(la, lb, rtol=1e-5, atol=1e-5)


def test_import_rejects_wrong_shapes(model_dir):
    src, dst = make_runner(model_dir), make_runner(model_dir, page_size=8)
    src.allocate(1, 5)
    src.forward([ForwardItem(1, tokens(5, 11), 0)])
    with pytest.raises(RuntimeFailure, match="do not match"):
        dst.import_request(1, src.export_request(1), 5)


def test_pool_exhaustion_is_reported_without_corruption(model_dir):
    r = make_runner(model_dir, page_size=4, max_tokens=16, max_requests=3)  # 4 pages
    assert r.num_total_pages == 4 and r.pages_needed(9) == 3
    r.allocate(1, 8)  # 2 pages
    ids = tokens(8, 12)
    before = r.forward([ForwardItem(1, ids[:6], 0)])
    assert r.can_allocate(8) and not r.can_allocate(9)
    r.allocate(2, 8)
    assert r.num_free_pages == 0
    assert not r.can_allocate(1)
    assert not r.ensure_capacity(1, 9)
    with pytest.raises(RuntimeFailure, match="exhausted"):
        r.forward([ForwardItem(1, ids[6:] + [1, 2], 6)])  # would need a third page
    with pytest.raises(RuntimeFailure, match="exhausted"):
        r.allocate(3, 1)
    assert r.cached_len(1) == 6  # the refused forward changed nothing
    r.free(2)
    r.free(2)  # idempotent
    assert r.num_free_pages == 2 and r.ensure_capacity(1, 9)
    after = r.forward([ForwardItem(1, ids[6:], 6)])
    fresh = make_runner(model_dir)
    fresh.allocate(1, 8)
    torch.testing.assert_close(torch.cat([before, after]), fresh.forward([ForwardItem(1, ids, 0)]),
                               rtol=1e-4, atol=1e-4)


def test_request_slots_are_bounded_and_recycled(model_dir):
    r = make_runner(model_dir, max_requests=2)
    r.allocate(1, 1)
    r.allocate(2, 1)
    assert not r.can_allocate(1)
    with pytest.raises(RuntimeFailure, match="slot"):
        r.allocate(3, 1)
    r.free(1)
    r.allocate(3, 1)  # recycled slot starts from a clean state
    ids = tokens(7, 13)
    got = r.forward([ForwardItem(3, ids, 0)])
    with torch.no_grad():
        ref = r.model(torch.tensor([ids])).float()[0]
    torch.testing.assert_close(got, ref, rtol=1e-4, atol=1e-4)


def test_forward_rejects_wrong_start_pos(model_dir):
    r = make_runner(model_dir)
    r.allocate(1, 4)
    with pytest.raises(RuntimeFailure, match="start_pos"):
        r.forward([ForwardItem(1, [1, 2], 3)])


def test_layout_is_derived_from_layer_kinds(model_dir):
    r = make_runner(model_dir, dtype="float32", page_size=4)
    lay = r.layout()
    assert lay.state_types == ("mamba", "swa")
    assert lay.layer_kinds == tuple(KINDS)
    assert lay.page_size == 4 and lay.dtype == "float32"
    cfg = r.config
    assert lay.kv_item_lens == (2 * 4 * cfg.num_kv_heads * cfg.head_dim * 4,)  # one full layer
    # item lengths are the byte sizes of what export_request sends for one request
    r.allocate(1, 3)
    r.forward([ForwardItem(1, [1, 2, 3], 0)])
    ex = r.export_request(1)
    assert lay.state_item_lens[0] == sum(ex[k].numel() * ex[k].element_size() for k in ("mamba_conv", "mamba_ssm"))
    assert lay.state_item_lens[1] == ex["swa"].numel() * ex["swa"].element_size()
    assert len(lay.weights_hash) == 16


def test_full_attention_only_models_truncate_across_forwards(tmp_path):
    d = write_random_model(tmp_path / "dense", layer_kinds=("full",))
    a, b = make_runner(d), make_runner(d)
    ids = tokens(12, 14)
    for r in (a, b):
        r.allocate(1, 12)
    for i, t in enumerate(ids):
        a.forward([ForwardItem(1, [t], i)])
    a.truncate(1, 5)  # seven single-token forwards back
    b.forward([ForwardItem(1, ids[:5], 0)])
    torch.testing.assert_close(a.forward([ForwardItem(1, [7, 8], 5)]), b.forward([ForwardItem(1, [7, 8], 5)]),
                               rtol=1e-5, atol=1e-5)
    with pytest.raises(RuntimeFailure, match="restorable"):
        a.truncate(1, 8)  # beyond what is cached


# ---- the lean draft chain (ModelRunner.greedy_chain) ----------------------------------------------------


@pytest.fixture(scope="module")
def full_dir(tmp_path_factory: pytest.TempPathFactory):
    return write_random_model(tmp_path_factory.mktemp("full") / "draft", layer_kinds=("full", "full"))


def generic_chain(r: ModelRunner, rid: int, feed: list[int], start: int, steps: int) -> list[int]:
    """What a drafter does without the lean path: one `forward` per step, argmax of the last row."""
    out: list[int] = []
    pos = start
    for _ in range(steps):
        logits = r.forward([ForwardItem(rid, feed, pos)])
        out.append(int(logits[-1].argmax()))
        pos += len(feed)
        feed = [out[-1]]  # the last proposal is never fed: the cache ends before it
    return out


@pytest.mark.parametrize("catch_up", [1, 2, 9])
def test_draft_chain_equals_forward_per_step(full_dir, catch_up):
    """The lean chain proposes what `forward` step by step proposes, leaves the same cache length, and the
    caches it wrote hold the same keys and values: the next forward's logits agree."""
    prompt, feed = tokens(13, 6), tokens(catch_up, 7)
    a, b = make_runner(full_dir), make_runner(full_dir)
    for r in (a, b):
        r.allocate(1, 64)
        r.forward([ForwardItem(1, prompt, 0)])
    for steps in (1, 3, 5):
        start = a.cached_len(1)
        got = a.draft_chain([1], [feed], [steps])[0]
        want = generic_chain(b, 1, feed, start, steps)
        assert got == want
        assert a.cached_len(1) == b.cached_len(1) == start + len(feed) + steps - 1
        torch.testing.assert_close(a.forward([ForwardItem(1, [5], a.cached_len(1))]),
                                   b.forward([ForwardItem(1, [5], b.cached_len(1))]), rtol=1e-5, atol=1e-5)
        a.truncate(1, start + 1)  # a drafter rolls back to what verify accepted
        b.truncate(1, start + 1)
        feed = [feed[0]]


def test_draft_chain_declines_hybrid_models_and_scattered_pages(model_dir, full_dir):
    """None, with the cache untouched, where the lean path does not apply; the caller runs `forward`."""
    hybrid = make_runner(model_dir)
    hybrid.allocate(1, 8)
    hybrid.forward([ForwardItem(1, tokens(5, 8), 0)])
    assert hybrid.draft_chain([1], [[3]], [3]) is None and hybrid.cached_len(1) == 5
    r = make_runner(full_dir)
    r.allocate(1, 4)
    r.allocate(2, 4)  # takes the page after request 1's: request 1's next page is not adjacent
    r.forward([ForwardItem(1, tokens(4, 9), 0)])
    r.allocate(3, 4)
    r.free(3)  # page 2 is free again, but page 1 (request 2) sits between: growth must move or scatter
    assert r.draft_chain([1], [[3]], [3]) is None and r.cached_len(1) == 4


def test_draft_chain_batched_equals_each_request_alone(full_dir):
    """Requests with different cached lengths, catch-ups and budgets chained in one call propose what each
    proposes through `forward` alone, and leave the same caches."""
    # requests 4 and 5 are new: each one's whole prompt is its catch-up (long spans, attended alone; cached
    # together by one `cache_lone`, whose last layer only writes keys and values)
    prompts = {1: tokens(13, 10), 2: tokens(6, 11), 3: tokens(21, 12), 4: [], 5: []}
    feeds = {1: tokens(1, 13), 2: tokens(2, 14), 3: tokens(1, 15), 4: tokens(LONE_SHORT + 3, 16),
             5: tokens(LONE_SHORT + 9, 17)}
    budgets = {1: 3, 2: 1, 3: 4, 4: 2, 5: 3}
    a, b = make_runner(full_dir), make_runner(full_dir)
    for r in (a, b):
        for rid, p in prompts.items():
            r.allocate(rid, 40)
            if p:
                r.forward([ForwardItem(rid, p, 0)])
    got = a.draft_chain(list(prompts), [feeds[r] for r in prompts], [budgets[r] for r in prompts])
    want = [generic_chain(b, rid, feeds[rid], len(prompts[rid]), budgets[rid]) for rid in prompts]
    assert got == want
    for rid in prompts:
        assert a.cached_len(rid) == b.cached_len(rid) == len(prompts[rid]) + len(feeds[rid]) + budgets[rid] - 1
        torch.testing.assert_close(a.forward([ForwardItem(rid, [7], a.cached_len(rid))]),
                                   b.forward([ForwardItem(rid, [7], b.cached_len(rid))]), rtol=1e-5, atol=1e-5)


def test_full_attention_caches_grow_on_consecutive_pages(full_dir):
    """A draft model's request whose next page is taken moves to a free run (its keys and values with it),
    so it stays one slice of the pool; pages are neither lost nor double-booked."""
    a, b = make_runner(full_dir), make_runner(full_dir, max_tokens=4096)
    assert not a.cache.keep_contiguous  # a target's cache: off; a drafter turns it on for its draft model
    ModelDrafter(a)
    assert a.cache.keep_contiguous
    hybrid = make_runner(model_dir_of_hybrid(full_dir))
    ModelDrafter(hybrid)  # a swa/mamba draft re-feeds from its cache's start: no lean chain, no moves
    assert not hybrid.cache.keep_contiguous
    prompt = tokens(8, 16)
    for r in (a, b):
        r.allocate(1, 8)
        r.forward([ForwardItem(1, prompt, 0)])
    a.allocate(2, 4)
    # hand request 2 the page right after request 1's, as the stack allocator of a busy pool would
    c, nxt = a.cache, a.cache.requests[1].pages[-1] + 1
    c._free_pages.remove(nxt)
    c._free_pages.append(c.requests[2].pages[0])
    c.requests[2].pages = [nxt]
    before = set(a.cache.requests[1].pages)
    assert a.ensure_capacity(1, 13)  # needs a third page: page 2 is taken, so request 1 moves
    pages = a.cache.requests[1].pages
    assert pages == list(range(pages[0], pages[0] + 4)) and not before & set(pages)
    held = [p for req in a.cache.requests.values() for p in req.pages]
    assert len(held) == len(set(held)) and len(held) + a.num_free_pages == a.num_total_pages
    assert not set(held) & set(a.cache._free_pages)
    torch.testing.assert_close(a.forward([ForwardItem(1, [9, 10], 8)]), b.forward([ForwardItem(1, [9, 10], 8)]))
    assert a.draft_chain([1], [[4]], [2]) is not None
    free_before = a.num_free_pages
    assert a.ensure_capacity(1, 20) and a.num_free_pages == free_before - 1  # room after it now: in place
    assert a.cache.requests[1].pages == list(range(pages[0], pages[0] + 5))
    a.allocate(3, 8)  # new requests land on consecutive pages too
    p3 = a.cache.requests[3].pages
    assert p3 == list(range(p3[0], p3[0] + 2))


def model_dir_of_hybrid(full_dir):
    return write_random_model(full_dir.parent / "hybrid-too", layer_kinds=("full", "swa"), sliding_window=4)


def test_draft_chain_samples_with_the_callers_choice(full_dir, monkeypatch):
    """A sampling `choose` (seeded generators, as a sampling drafter passes) draws what the same draws over
    `forward` per step draw, request by request in the same order; where the small-row kernel builds, the
    chain's forwards are its fused loop, one call per step for both requests."""
    from specctl.engine import smallgemm
    from specctl.engine.sampling import SamplingParams, probs_from_logits, sample_from_probs

    calls: list[int] = []
    fused = smallgemm.SmallGemm.lone_chains

    def counted(self, model, layers, bases, *rest, **kw):
        calls.append(len(bases))
        return fused(self, model, layers, bases, *rest, **kw)

    monkeypatch.setattr(smallgemm.SmallGemm, "lone_chains", counted)

    prompts = {1: tokens(9, 20), 2: tokens(14, 21)}
    params = [SamplingParams(temperature=0.8, top_p=0.9, seed=s) for s in (1, 2)]

    def sampler(gens):
        def choose(logits, active, j):
            return sample_from_probs(probs_from_logits(logits, [params[a] for a in active]), [gens[a] for a in active])
        return choose

    a, b = make_runner(full_dir), make_runner(full_dir)
    for r in (a, b):
        for rid, p in prompts.items():
            r.allocate(rid, 40)
            r.forward([ForwardItem(rid, p, 0)])
    gens_a = [torch.Generator().manual_seed(s) for s in (1, 2)]
    got = a.draft_chain([1, 2], [[3], [4]], [4, 4], sampler(gens_a))
    gens_b = [torch.Generator().manual_seed(s) for s in (1, 2)]
    want: list[list[int]] = [[], []]
    feed = [[3], [4]]
    for j in range(4):
        logits = b.forward([ForwardItem(rid, feed[i], b.cached_len(rid)) for i, rid in enumerate((1, 2))])
        toks = sampler(gens_b)(logits, [0, 1], j).tolist()
        for i in range(2):
            want[i].append(toks[i])
        feed = [[t] for t in toks]  # the last draws are never fed
    assert got == want
    assert calls == ([2, 2, 2, 2] if smallgemm.kernel() is not None else [])
    assert [a.cached_len(r) for r in (1, 2)] == [b.cached_len(r) for r in (1, 2)]


def test_draft_chain_draws_temperature_rows_in_the_kernel(full_dir, monkeypatch):
    """With `sampling` (temperature-only rows, a greedy one among them, budgets that differ, the callers'
    uniforms), the fused loop draws every chain in ONE call: the tokens are those the same uniforms pick
    through `forward` step by step (inverse CDF of softmax(logits / T)), and each chosen position's
    distribution is that softmax (one-hot at the argmax for the greedy row), to float32 rounding."""
    from specctl.engine import smallgemm
    from specctl.engine.sampling import SamplingParams, inverse_cdf, probs_from_logits

    if smallgemm.kernel() is None:
        pytest.skip("no small-row kernel here (no C compiler, or SPECCTL_SMALL_GEMM=0)")
    calls = spy_chain_draws(monkeypatch)
    prompts = {1: tokens(9, 30), 2: tokens(14, 31), 3: tokens(5, 32)}
    params = [SamplingParams(temperature=0.7), SamplingParams(), SamplingParams(temperature=1.3)]
    budgets = [4, 2, 3]
    unif = [torch.rand(k, generator=torch.Generator().manual_seed(40 + i)).tolist() if p.temperature else []
            for i, (p, k) in enumerate(zip(params, budgets, strict=True))]
    a, b = make_runner(full_dir), make_runner(full_dir)
    for r in (a, b):
        for rid, p in prompts.items():
            r.allocate(rid, 40)
            r.forward([ForwardItem(rid, p, 0)])
    vocab = a.facts.vocab_size
    probs = torch.full((3, max(budgets), vocab), -1.0)
    plan = smallgemm.ChainSampling([p.temperature for p in params], unif, probs)
    got = a.draft_chain([1, 2, 3], [[3], [4], [5]], budgets, lambda *_: pytest.fail("choose ran"), plan)
    assert calls == [True]
    feed = {1: [3], 2: [4], 3: [5]}
    for i, rid in enumerate(prompts):
        want = []
        for j in range(budgets[i]):
            logits = b.forward([ForwardItem(rid, feed[rid], b.cached_len(rid))])
            q = probs_from_logits(logits, [params[i]])
            u = torch.tensor([unif[i][j] if unif[i] else 0.5])
            want.append(int(inverse_cdf(q, u)[0]))
            torch.testing.assert_close(probs[i, j], q[0], rtol=1e-5, atol=1e-6)
            feed[rid] = [want[-1]]
        assert got[i] == want
        assert a.cached_len(rid) == b.cached_len(rid)
    assert (probs[1, 2:] == -1.0).all()  # past a request's budget nothing is written


def test_draft_chain_with_a_short_request_at_the_end_of_the_pool(full_dir):
    """Padded key reads of a short request on the pool's last pages stay inside the pool (masked, clamped)."""
    a, b = make_runner(full_dir), make_runner(full_dir)
    long_prompt, short_prompt = tokens(30, 22), tokens(5, 23)
    for r in (a, b):
        r.allocate(1, 32)  # pages 0-7
        r.allocate(3, 4 * (r.num_total_pages - 10))  # filler: every page up to the last two
        r.allocate(2, 8)  # the last two pages
        r.free(3)
        assert r.cache.requests[2].pages[-1] == r.num_total_pages - 1
        r.forward([ForwardItem(1, long_prompt, 0)])
        r.forward([ForwardItem(2, short_prompt, 0)])
    got = a.draft_chain([1, 2], [[3], [4]], [2, 2])
    want = [generic_chain(b, 1, [3], 30, 2), generic_chain(b, 2, [4], 5, 2)]
    assert got == want


def test_a_padded_verify_runs_the_mlp_on_its_real_tokens_only_with_the_same_bits(model_dir, monkeypatch):
    """Requests that drafted unequally share one padded forward; the norm and MLP see only the real tokens
    (padding rows skip them), and every request's logits are bit for bit those of its own forward, on
    every cache kind (mamba, swa, full), and so is the next step after rolling back. (Bit for bit with the
    small-row kernel, which computes a row the same whatever the row count; torch's kernels need not.)"""
    from specctl.engine import model as model_mod
    from specctl.engine import smallgemm

    def same(a: torch.Tensor, b: torch.Tensor) -> None:
        if smallgemm.kernel() is not None:
            assert torch.equal(a, b)
        else:
            torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5)

    seen: list[int] = []
    real_mlp = model_mod.MLP.forward

    def counting(self, x):  # type: ignore[no-untyped-def]
        seen.append(x.numel() // x.shape[-1])
        return real_mlp(self, x)

    monkeypatch.setattr(model_mod.MLP, "forward", counting)
    prompts = {1: tokens(9, 4), 2: tokens(12, 5), 3: tokens(7, 6)}
    drafts = {1: tokens(4, 7), 2: tokens(1, 8), 3: tokens(3, 9)}  # unequal: 4, 1 and 3 positions
    together, alone = make_runner(model_dir), make_runner(model_dir)
    for r in (together, alone):
        for rid, p in prompts.items():
            r.allocate(rid, len(p) + 8)
            r.forward([ForwardItem(rid, p, 0)])
    seen.clear()
    got = together.forward([ForwardItem(rid, d, len(prompts[rid])) for rid, d in drafts.items()])
    layers = len(KINDS)
    assert seen == [sum(map(len, drafts.values()))] * layers  # 8 real tokens, not 3 x 4 padded rows
    want = torch.cat([alone.forward([ForwardItem(rid, d, len(prompts[rid]))]) for rid, d in drafts.items()])
    same(got, want)
    for r in (together, alone):  # roll back to different lengths, then one more step each
        for rid, keep in ((1, 2), (2, 1), (3, 3)):
            r.truncate(rid, len(prompts[rid]) + keep)
    items = [ForwardItem(rid, [65], together.cached_len(rid)) for rid in prompts]
    same(together.forward(items), torch.cat([alone.forward([it]) for it in items]))
