"""The small-row matmul kernel (engine/smallgemm.py, engine/smallgemm.c), built here with the real compiler.

- it builds on a machine with a C compiler, and each of its code paths (AVX-512 intrinsics where the CPU
  has them, AVX2 and FMA intrinsics where it has those, the compiler-vectorised loops otherwise) computes
  x W^T + b as float64 does, to float32 rounding, for row, column and feature counts around its blocks
  (8 and 3 rows, 64-column panels, 16- and 8-lane tails);
- a row computes to the same bits alone and inside any batch (what makes a verify's logits a decode's);
- `PackedLinear` follows an in-place update of its weight on the small-row path;
- batch-1 greedy drafting runs its whole chain in the kernel's fused loop, and emits transformers' own
  greedy tokens for Llama (Llama 3 rope, untied head) and Qwen2 (q/k/v biases, tied) checkpoints;
- requests chained together in that loop get the tokens and logits each gets alone, bit for bit, and
  torch's to float32 rounding, on every code path;
- the build is cached per source, compiler and CPU, and without a compiler (or with SPECCTL_SMALL_GEMM=0)
  `kernel()` is None, so the model keeps torch's kernels.
"""

from __future__ import annotations

import ctypes
import os
import shutil
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.nn.functional as F

from specctl.engine import smallgemm
from specctl.engine.model_runner import ForwardItem, ModelRunner
from specctl.engine.ops import PackedLinear, can_pack

from test_model_hf import VOCAB, write_hf_model  # isort: skip

HAVE_CC = shutil.which("cc") is not None and os.environ.get("SPECCTL_SMALL_GEMM", "1") != "0"
needs_cc = pytest.mark.skipif(not HAVE_CC, reason="no C compiler here (or SPECCTL_SMALL_GEMM=0): no kernel to test")


@pytest.fixture(scope="module")
def native(tmp_path_factory: pytest.TempPathFactory) -> smallgemm.SmallGemm:
    k = smallgemm.kernel()
    assert k is not None, "cc is here, so the kernel must build and load"
    return k


@pytest.fixture(scope="module")
def avx2(tmp_path_factory: pytest.TempPathFactory) -> smallgemm.SmallGemm:
    """The same source built without AVX-512: the AVX2 and FMA intrinsics most x86 CPUs run."""
    if not {"avx2", "fma"} <= set(smallgemm._cpu_flags().split()):
        pytest.skip("this CPU has no AVX2 and FMA")
    cc = shutil.which("cc")
    assert cc is not None
    out = tmp_path_factory.mktemp("sg") / "smallgemm-avx2.so"
    assert smallgemm._build(cc, out, flag_sets=(["-O3", "-march=native", "-mno-avx512f"],))
    k = smallgemm.SmallGemm(ctypes.CDLL(str(out)), out)
    assert k.isa == 256
    return k


@pytest.fixture(scope="module")
def portable(tmp_path_factory: pytest.TempPathFactory) -> smallgemm.SmallGemm:
    """The same source built without AVX-512, AVX2 or FMA: the compiler-vectorised path other CPUs run."""
    cc = shutil.which("cc")
    assert cc is not None
    out = tmp_path_factory.mktemp("sg") / "smallgemm-portable.so"
    assert smallgemm._build(cc, out, flag_sets=(["-O3", "-march=native", "-mno-avx512f", "-mno-avx2", "-mno-fma"],
                                                ["-O3"]))
    k = smallgemm.SmallGemm(ctypes.CDLL(str(out)), out)
    assert k.isa == 0
    return k


def torch_runner_class(monkeypatch: pytest.MonkeyPatch, k: smallgemm.SmallGemm) -> type[ModelRunner]:
    """Make `smallgemm.kernel()` return k, and return a ModelRunner whose construction and forwards see no
    kernel: the torch-only reference."""
    using: list[smallgemm.SmallGemm | None] = [k]
    monkeypatch.setattr(smallgemm, "kernel", lambda: using[0])

    class TorchRunner(ModelRunner):
        def __init__(self, *a: Any, **kw: Any) -> None:
            using[0] = None
            try:
                super().__init__(*a, **kw)
            finally:
                using[0] = k

        def forward(self, items: Any) -> torch.Tensor:
            using[0] = None
            try:
                return super().forward(items)
            finally:
                using[0] = k

    return TorchRunner


SHAPES = [(1, 1, 1), (1, 17, 5), (3, 64, 192), (4, 70, 33), (5, 100, 40), (8, 65, 128), (9, 260, 192), (16, 1024, 192),
          (33, 100, 48), (50, 66, 20)]


@needs_cc
@pytest.mark.parametrize("path", ["native", "avx2", "portable"])
@pytest.mark.parametrize("rows,n,k", SHAPES)
@pytest.mark.parametrize("bias", [False, True])
def test_kernel_equals_float64_reference(request, path, rows, n, k, bias):
    sg: smallgemm.SmallGemm = request.getfixturevalue(path)
    g = torch.Generator().manual_seed(rows * 1000 + n + k)
    w = torch.randn(n, k, generator=g)
    b = torch.randn(n, generator=g) if bias else None
    x = torch.randn(rows, k, generator=g)
    got = sg.linear(x, sg.pack(w), n, b)
    ref = F.linear(x.double(), w.double(), None if b is None else b.double())
    assert got.shape == (rows, n) and got.dtype == torch.float32
    torch.testing.assert_close(got.double(), ref, rtol=1e-5, atol=1e-5 * k**0.5)


@needs_cc
def test_kernel_takes_leading_dims_and_non_contiguous_rows(native):
    g = torch.Generator().manual_seed(3)
    w = torch.randn(70, 40, generator=g)
    x = torch.randn(2, 3, 80, generator=g)[..., ::2]  # [2, 3, 40], not contiguous
    got = native.linear(x, native.pack(w), 70, None)
    torch.testing.assert_close(got, F.linear(x, w), rtol=1e-5, atol=1e-5)
    with pytest.raises(ValueError, match="40 features"):
        native.linear(torch.randn(2, 41), native.pack(w), 70, None)
    with pytest.raises(ValueError, match="float32"):
        native.linear(x.double(), native.pack(w), 70, None)


@needs_cc
@pytest.mark.parametrize("path", ["native", "avx2", "portable"])
def test_a_row_computes_to_the_same_bits_alone_and_in_any_batch(request, path):
    sg: smallgemm.SmallGemm = request.getfixturevalue(path)
    g = torch.Generator().manual_seed(11)
    w, b = torch.randn(200, 96, generator=g), torch.randn(200, generator=g)
    wp = sg.pack(w)
    x = torch.randn(200, 96, generator=g)  # past the AVX-512 path's chunks of 64 rows
    alone = torch.cat([sg.linear(x[i : i + 1], wp, 200, b) for i in range(x.shape[0])])
    # every block split of the AVX-512 path up to 16 rows (one block to 8, then 6s and a 4 + 3 or 4 + 4 tail)
    for rows in (*range(2, 17), 32, 40, 64, 65, 70, 130, 200):
        assert torch.equal(sg.linear(x[:rows], wp, 200, b), alone[:rows]), rows


def _paged_case(b: int, n: int, heads: int, kv: int, d: int, ctx: list[int], seed: int
                ) -> tuple[torch.Tensor, ...]:
    """Pools of keys and values on shuffled pages of 4 slots, item i's keys at positions 0..ctx[i] + n - 1
    (padded with slot 0 at a position no query sees), its n queries at the last n positions."""
    g = torch.Generator().manual_seed(seed)
    kmax = max(ctx) + n
    pages = -(-kmax // 4)
    order = torch.randperm(b * pages + 3, generator=g)
    keys, values = (torch.randn(4 * (b * pages + 3), kv, d, generator=g) for _ in range(2))
    slots = torch.zeros(b, kmax, dtype=torch.long)
    kpos = torch.full((b, kmax), 1 << 40, dtype=torch.long)
    for i, c in enumerate(ctx):
        own = (order[i * pages:(i + 1) * pages, None] * 4 + torch.arange(4)).flatten()
        slots[i, : c + n] = own[: c + n]
        kpos[i, : c + n] = torch.arange(c + n)
    qpos = torch.tensor(ctx)[:, None] + torch.arange(n)[None, :]
    q = torch.randn(b, n, heads, d, generator=g)
    return q, keys, values, slots, kpos, qpos


def _attention_reference(q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, slots: torch.Tensor,
                         kpos: torch.Tensor, qpos: torch.Tensor, window: int) -> torch.Tensor:
    b, n, heads, d = q.shape
    rep = heads // keys.shape[1]
    out = torch.zeros(b, n, heads, d, dtype=torch.float64)
    for i in range(b):
        k = keys[slots[i]].double().repeat_interleave(rep, dim=1)  # [kmax, heads, d]
        v = values[slots[i]].double().repeat_interleave(rep, dim=1)
        for j in range(n):
            p = int(qpos[i, j])
            seen = (kpos[i] <= p) & ((kpos[i] > p - window) if window > 0 else True)
            w = torch.einsum("hd,khd->hk", q[i, j].double(), k[seen]).div(d**0.5).softmax(-1)
            out[i, j] = torch.einsum("hk,khd->hd", w, v[seen])
    return out


@needs_cc
@pytest.mark.parametrize("path", ["native", "avx2", "portable"])
@pytest.mark.parametrize("heads,kv,d", [(8, 4, 32), (3, 1, 64), (2, 1, 64), (4, 4, 16), (16, 2, 128), (6, 2, 24),
                                        (8, 1, 48)])
@pytest.mark.parametrize("window", [0, 5])
def test_paged_attention_is_the_float64_softmax_and_a_query_is_the_same_alone(request, path, heads, kv, d, window):
    """`attention` over keys on scattered pages, for head sizes on and off the 16-lane blocks, grouped query
    heads 1-8 per key/value head, key counts around multiples of 16 (1, 15-17, 31-33, 48): float64's
    softmax attention to float32 rounding; a padding query gets zeros; and every query of a 4-position
    verify is the bits that query gets as a decode step of its own (what makes a verify's logits a decode's)."""
    sg: smallgemm.SmallGemm = request.getfixturevalue(path)
    ctx = [0, 12, 13, 14, 27, 28, 29, 44]
    q, keys, values, slots, kpos, qpos = _paged_case(len(ctx), 4, heads, kv, d, ctx, seed=heads * 100 + d + window)
    got = sg.attention(q, keys, values, slots, kpos, qpos, None, window)
    ref = _attention_reference(q, keys, values, slots, kpos, qpos, window)
    torch.testing.assert_close(got.double(), ref, rtol=1e-5, atol=1e-5)
    for j in range(4):
        alone = sg.attention(q[:, j : j + 1].contiguous(), keys, values, slots, kpos, qpos[:, j : j + 1].contiguous(),
                             None, window)
        assert torch.equal(alone[:, 0], got[:, j]), j
    valid = torch.ones(len(ctx), 4, dtype=torch.bool)
    valid[1:, 2:] = False
    padded = sg.attention(q, keys, values, slots, kpos, qpos, valid, window)
    assert torch.equal(padded[valid], got[valid])
    assert not padded[~valid].any()


@needs_cc
@pytest.mark.parametrize("path", ["native", "avx2", "portable"])
@pytest.mark.parametrize("shape", [(1, 192), (7, 3, 24), (33, 256), (2, 5, 17)])
def test_rms_norm_equals_torch_and_computes_a_row_alone(request, path, shape):
    sg: smallgemm.SmallGemm = request.getfixturevalue(path)
    g = torch.Generator().manual_seed(sum(shape))
    x, w = torch.randn(*shape, generator=g) * 3, torch.randn(shape[-1], generator=g)
    got = sg.rms_norm(x, w, 1e-5)
    ref = F.rms_norm(x.double(), (shape[-1],), w.double(), 1e-5)
    assert got.shape == x.shape and got.dtype == torch.float32
    torch.testing.assert_close(got.double(), ref, rtol=1e-5, atol=1e-5)
    flat = x.reshape(-1, shape[-1])
    alone = torch.cat([sg.rms_norm(flat[i : i + 1], w, 1e-5) for i in range(flat.shape[0])])
    assert torch.equal(got.reshape(-1, shape[-1]), alone)
    with pytest.raises(ValueError, match="float32"):
        sg.rms_norm(x.double(), w, 1e-5)


@needs_cc
def test_serving_norms_use_the_kernel_and_training_keeps_autograd(monkeypatch, native):
    from specctl.engine.model import RMSNorm

    monkeypatch.setattr(smallgemm, "kernel", lambda: native)
    calls: list[int] = []
    real = native.rms_norm
    monkeypatch.setattr(native, "rms_norm", lambda x, w, eps: calls.append(1) or real(x, w, eps))
    norm = RMSNorm(48, 1e-5)
    with torch.no_grad():
        norm.weight.copy_(torch.linspace(0.5, 1.5, 48))
    x = torch.randn(4, 48, requires_grad=True)
    with torch.no_grad():
        served = norm(x)
    assert calls == [1]
    trained = norm(x)  # grad enabled: torch's op, which backpropagates
    assert calls == [1] and trained.requires_grad
    trained.sum().backward()
    assert x.grad is not None and norm.weight.grad is not None
    torch.testing.assert_close(served, trained.detach(), rtol=1e-5, atol=1e-5)


@needs_cc
@pytest.mark.skipif(not can_pack(torch.zeros(1, 1)), reason="this torch build has no oneDNN fp32 packing")
def test_packed_linear_uses_the_kernel_and_follows_in_place_weight_updates(native):
    g = torch.Generator().manual_seed(5)
    w = torch.nn.Parameter(torch.randn(96, 64, generator=g))
    lin = PackedLinear(w, None)
    assert lin.wt is not None and lin.small is native
    x = torch.randn(4, 64, generator=g)
    torch.testing.assert_close(lin(x), F.linear(x, w), rtol=1e-5, atol=1e-5)
    with torch.no_grad():
        w.mul_(-2.0)  # a training step rewriting the weight in place
    torch.testing.assert_close(lin(x), F.linear(x, w), rtol=1e-5, atol=1e-5)


@needs_cc
def test_the_build_is_cached_and_reused(tmp_path, monkeypatch):
    monkeypatch.setenv("SPECCTL_CACHE_DIR", str(tmp_path))
    first = smallgemm._load()
    assert first is not None and first.path.parent == tmp_path / "kernels"
    built = first.path.stat().st_mtime_ns
    again = smallgemm._load()
    assert again is not None and again.path == first.path and again.path.stat().st_mtime_ns == built
    assert [p.name for p in (tmp_path / "kernels").iterdir()] == [first.path.name]  # no temporary left


def test_without_a_compiler_or_when_disabled_there_is_no_kernel(tmp_path, monkeypatch):
    monkeypatch.setenv("SPECCTL_CACHE_DIR", str(tmp_path))
    monkeypatch.setenv("CC", str(tmp_path / "no-such-cc"))
    assert smallgemm._load() is None
    monkeypatch.delenv("CC")
    monkeypatch.setenv("SPECCTL_SMALL_GEMM", "0")
    assert smallgemm._load() is None
    assert not (tmp_path / "kernels").exists()


def test_a_compiler_that_fails_leaves_no_kernel_and_no_file(tmp_path, monkeypatch):
    broken = tmp_path / "cc"
    broken.write_text("#!/bin/sh\necho 'cc: internal error' >&2\nexit 1\n")
    broken.chmod(0o755)
    monkeypatch.setenv("SPECCTL_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setenv("CC", str(broken))
    assert smallgemm._load() is None
    assert list(Path(tmp_path / "cache").rglob("*.so")) == []


@needs_cc
@pytest.mark.parametrize("arch", ["llama3-rope", "qwen2-full"])
@pytest.mark.parametrize("catch_up", [1, 3, 20])  # 20 > LONE_SHORT: a batched forward_lone caches all but the last
def test_the_fused_draft_chain_is_transformers_greedy(tmp_path, monkeypatch, arch, catch_up):
    """Batch-1 greedy drafting runs the whole chain in smallgemm.c's fused loop; its tokens are what
    transformers' own greedy decoding of the same checkpoint emits, and the keys and values it cached give
    the next forward transformers' logits."""
    pytest.importorskip("transformers")
    ref = write_hf_model(tmp_path / arch, arch)
    calls: list[int] = []
    fused = smallgemm.SmallGemm.lone_chains

    def counted(self: smallgemm.SmallGemm, *a: Any, **k: Any) -> list[list[int]]:
        calls.append(1)
        return fused(self, *a, **k)

    monkeypatch.setattr(smallgemm.SmallGemm, "lone_chains", counted)
    runner = ModelRunner(str(tmp_path / arch), page_size=4, max_tokens=256, max_requests=2)
    ids = torch.randint(3, VOCAB, (30,), generator=torch.Generator().manual_seed(catch_up)).tolist()
    cached, feed, steps = ids[:-catch_up], ids[-catch_up:], 6
    runner.allocate(1, len(ids) + steps)
    runner.forward([ForwardItem(1, cached, 0)])
    chain = runner.draft_chain([1], [feed], [steps])
    assert calls == [1] and chain is not None
    want: list[int] = []
    with torch.no_grad():  # transformers' greedy decoding, written out (generate would stop at EOS)
        for _ in range(steps):
            want.append(int(ref(torch.tensor([ids + want])).logits[0, -1].argmax()))
    assert chain[0] == want
    assert runner.cached_len(1) == len(ids) + steps - 1
    nxt = runner.forward([ForwardItem(1, [chain[0][-1]], len(ids) + steps - 1)])
    with torch.no_grad():
        full = ref(torch.tensor([ids + chain[0]])).logits[0, -1].float()
    torch.testing.assert_close(nxt[0], full, rtol=1e-4, atol=1e-4)


@needs_cc
@pytest.mark.parametrize("arch", ["llama3-rope", "qwen2-full"])
def test_a_full_attention_models_steps_run_whole_in_the_kernel_as_layer_by_layer(tmp_path, arch):
    """A decode step's or a verify's forward of a full-attention model runs all its layers in one kernel call
    (`SmallGemm.full_layers`): the logits the layer-by-layer path gives to float32 rounding, the same caches
    (the steps after, rollbacks included, agree; a padding row writes nothing), and each request's rows the
    bits it gets alone (a verify's logits are its decode steps')."""
    from specctl.engine.model import HybridForCausalLM

    write_hf_model(tmp_path / arch, arch)
    fused, plain, alone = (ModelRunner(str(tmp_path / arch), page_size=4, max_tokens=512, max_requests=4,
                                       max_draft_tokens=5) for _ in range(3))
    calls: list[bool] = []
    run = HybridForCausalLM._fused_layers

    def counted(ids: torch.Tensor, ctx: Any) -> torch.Tensor | None:
        out = run(fused.model, ids, ctx)
        calls.append(out is not None)
        return out

    fused.model._fused_layers = counted  # type: ignore[method-assign]
    plain.model._fused_layers = lambda ids, ctx: None  # type: ignore[method-assign]
    gen = torch.Generator().manual_seed(3)
    prompts = [torch.randint(3, VOCAB, (n,), generator=gen).tolist() for n in (9, 21, 4, 14)]
    for r in (fused, plain, alone):
        for rid, p in enumerate(prompts):
            r.allocate(rid, 64)
            r.forward([ForwardItem(rid, p, 0)])
    calls.clear()
    rounds = [([3, 1, 5, 2], None), ([1, 1, 1, 1], None), ([4, 2, 1, 6], [1, 0, 0, 3])]  # (fed, accepted after)
    for fed, keep in rounds:
        items = [ForwardItem(rid, torch.randint(3, VOCAB, (n,), generator=gen).tolist(), fused.cached_len(rid))
                 for rid, n in enumerate(fed)]
        got, want = fused.forward(items), plain.forward(items)
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
        assert torch.equal(got[: fed[0]], alone.forward([items[0]]))  # the same request alone: the same bits
        for r in (plain, alone):
            for it in items[1:] if r is alone else []:
                r.forward([it])  # keep `alone`'s other requests in step
        if keep is not None:  # a verify rolled back to what was accepted
            for r in (fused, plain, alone):
                for it, k in zip(items, keep, strict=True):
                    r.truncate(it.rid, it.start_pos + k + 1)
    assert calls == [True] * len(rounds)
    nxt = [ForwardItem(rid, [5], fused.cached_len(rid)) for rid in range(len(prompts))]
    torch.testing.assert_close(fused.forward(nxt), plain.forward(nxt), rtol=1e-5, atol=1e-5)


@needs_cc
def test_the_whole_model_call_follows_an_in_place_weight_update(tmp_path):
    """The kernel's view of the weights is kept between steps (`_kernel_model`), but an in-place update of a
    weight (a reload, a fine-tune step) shows in the next step, as on the layer-by-layer path."""
    write_hf_model(tmp_path / "m", "llama")
    fused, plain = (ModelRunner(str(tmp_path / "m"), page_size=4, max_tokens=256, max_requests=2) for _ in range(2))
    plain.model._fused_layers = lambda ids, ctx: None  # type: ignore[method-assign]
    prompt = torch.randint(3, VOCAB, (11,), generator=torch.Generator().manual_seed(5)).tolist()
    for r in (fused, plain):
        r.allocate(1, 32)
        r.forward([ForwardItem(1, prompt, 0)])
        r.forward([ForwardItem(1, [4], 11)])  # a step: builds and keeps the kernel's view
        with torch.no_grad():
            r.model.model.layers[1].mlp.down_proj.weight.mul_(-0.5)
            r.model.lm_head.weight.add_(0.25)
    step = [ForwardItem(1, [9, 8], 12)]
    torch.testing.assert_close(fused.forward(step), plain.forward(step), rtol=1e-5, atol=1e-5)


@needs_cc
@pytest.mark.parametrize("path", ["native", "avx2", "portable"])
# 64: the vector paths' whole chunks; 48 and 80: the weighted sum's partial chunk of 16-feature vectors (48 alone,
# 80 after a whole one); 24: the tails and fallbacks
@pytest.mark.parametrize("head_dim", [24, 48, 64, 80])
def test_batched_chains_give_each_request_its_own_logits(request, tmp_path, monkeypatch, path, head_dim):
    """Requests chained together in one fused-loop call (different cached lengths, feeds and steps) get
    bit for bit the tokens and logits each gets chained alone, and torch's per-step forward gives the same
    logits to float32 rounding, on both of the kernel's code paths."""
    from specctl.engine.checkpoint import write_random_model

    k = request.getfixturevalue(path)
    torch_runner = torch_runner_class(monkeypatch, k)
    model_dir = write_random_model(tmp_path / f"d{head_dim}", layer_kinds=("full", "full"), hidden_size=48,
                                   intermediate_size=80, num_heads=2, num_kv_heads=1, head_dim=head_dim)
    gen = torch.Generator().manual_seed(head_dim)
    prompts = [torch.randint(3, 250, (n,), generator=gen).tolist() for n in (37, 5, 70)]
    feeds = [torch.randint(3, 250, (n,), generator=gen).tolist() for n in (1, 3, 2)]
    steps = [4, 1, 6]

    def chained(runner: ModelRunner, rids: list[int]) -> tuple[list[list[int]], torch.Tensor]:
        pools = runner.cache.kv_pools()
        starts = [runner.cached_len(r) for r in rids]
        ends = [s + len(feeds[r]) + steps[r] - 1 for s, r in zip(starts, rids, strict=True)]
        assert all(runner.ensure_capacity(r, e) for r, e in zip(rids, ends, strict=True))
        bases = [runner.cache.lone_base(r, e) for r, e in zip(rids, ends, strict=True)]
        logits = torch.zeros(len(rids), max(steps[r] for r in rids), 260)
        toks = runner.model.lone_chain(pools, bases, starts, [feeds[r] for r in rids], [steps[r] for r in rids],
                                       logits)
        assert toks is not None
        return toks, logits

    together, alone, ref = (cls(str(model_dir), page_size=4, max_tokens=512, max_requests=4)
                            for cls in (ModelRunner, ModelRunner, torch_runner))
    for runner in (together, alone, ref):
        for rid, p in enumerate(prompts):
            runner.allocate(rid, len(p) + 12)
            runner.forward([ForwardItem(rid, p, 0)])
    toks, logits = chained(together, [0, 1, 2])
    for rid in range(3):
        t, lg = chained(alone, [rid])
        assert toks[rid] == t[0]
        assert torch.equal(logits[rid, : steps[rid]], lg[0, : steps[rid]])
        want, feed = [], feeds[rid]
        for j in range(steps[rid]):  # torch's forward, step by step, on the chain's own tokens
            row = ref.forward([ForwardItem(rid, feed, ref.cached_len(rid))])[-1]
            torch.testing.assert_close(logits[rid, j], row.float(), rtol=1e-4, atol=1e-4)
            want.append(int(row.argmax()))
            feed = [toks[rid][j]]
        assert toks[rid] == want


@needs_cc
@pytest.mark.parametrize("path", ["native", "avx2", "portable"])
@pytest.mark.parametrize("d_state,head_dim", [(16, 48), (8, 16)])  # 16: one vector per state row; 8: the loops
def test_the_mixer_kernels_are_torchs_and_a_verify_is_decode_steps(request, tmp_path, monkeypatch, path,
                                                                  d_state, head_dim):
    """A hybrid model's decode steps and verifies run the mamba mixer in `mamba_short` and attention (sliding
    window and full) in `attention`: a padded verify of three requests gives torch's logits to float32
    rounding, rolling back to part of it leaves the states torch's rollback leaves, and a 4-position
    verify's logits and the states it commits are those of 4 decode steps, bit for bit."""
    from specctl.engine.checkpoint import write_random_model

    k = request.getfixturevalue(path)
    model_dir = write_random_model(tmp_path / f"m{d_state}", layer_kinds=("mamba", "swa", "full"), hidden_size=48,
                                   intermediate_size=64, mamba_d_state=d_state, mamba_head_dim=head_dim,
                                   sliding_window=6, head_dim=16 if d_state == 16 else 24)
    calls: list[int] = []
    attended: list[int] = []
    real, real_attention = smallgemm.SmallGemm.mamba_short, smallgemm.SmallGemm.attention

    def counted(self: smallgemm.SmallGemm, zxbcdt: torch.Tensor, *a: Any, **kw: Any) -> Any:
        calls.append(zxbcdt.shape[1])
        return real(self, zxbcdt, *a, **kw)

    def counted_attention(self: smallgemm.SmallGemm, q: torch.Tensor, *a: Any) -> Any:
        attended.append(q.shape[1])
        return real_attention(self, q, *a)

    monkeypatch.setattr(smallgemm.SmallGemm, "mamba_short", counted)
    monkeypatch.setattr(smallgemm.SmallGemm, "attention", counted_attention)
    ref = torch_runner_class(monkeypatch, k)(str(model_dir), page_size=4, max_tokens=512, max_requests=4,
                                             max_draft_tokens=4)
    fast, steps = (ModelRunner(str(model_dir), page_size=4, max_tokens=512, max_requests=4, max_draft_tokens=4)
                   for _ in range(2))
    gen = torch.Generator().manual_seed(d_state)
    prompts = [torch.randint(3, 250, (n,), generator=gen).tolist() for n in (19, 7, 33)]
    for runner in (ref, fast, steps):
        for rid, p in enumerate(prompts):
            runner.allocate(rid, len(p) + 12)
            runner.forward([ForwardItem(rid, p, 0)])
    assert calls == [19, 7, 33] * 2  # the prompts too (a small state): fast and steps, not the torch reference
    calls.clear()
    attended.clear()
    feeds = [torch.randint(3, 250, (n,), generator=gen).tolist() for n in (4, 1, 3)]
    items = [ForwardItem(rid, f, len(prompts[rid])) for rid, f in enumerate(feeds)]
    torch.testing.assert_close(fast.forward(items), ref.forward(items), rtol=1e-4, atol=1e-4)
    assert calls == [4] and attended == [4, 4]  # the padded group of three, one call per layer
    for runner in (fast, ref):  # keep 2, 1 and 3 of the fed tokens, then go on from there
        for rid, kept in enumerate((2, 1, 3)):
            runner.truncate(rid, len(prompts[rid]) + kept)
    nxt = [ForwardItem(rid, [9], len(prompts[rid]) + kept) for rid, kept in enumerate((2, 1, 3))]
    torch.testing.assert_close(fast.forward(nxt), ref.forward(nxt), rtol=1e-4, atol=1e-4)

    m = fast.cache.mamba_index[0]
    stepped = torch.cat([steps.forward([ForwardItem(0, [tok], steps.cached_len(0))])  # request 0's verify,
                         for tok in feeds[0]])  # as decode steps
    fresh = ModelRunner(str(model_dir), page_size=4, max_tokens=512, max_requests=4, max_draft_tokens=4)
    fresh.allocate(0, len(prompts[0]) + 12)
    fresh.forward([ForwardItem(0, prompts[0], 0)])
    assert torch.equal(fresh.forward([ForwardItem(0, feeds[0], len(prompts[0]))]), stepped)
    slot = steps.cache.requests[0].slot, fresh.cache.requests[0].slot
    assert torch.equal(steps.cache.ssm[m, slot[0]], fresh.cache.ssm[m, slot[1]])
    assert torch.equal(steps.cache.conv[m, slot[0]], fresh.cache.conv[m, slot[1]])


@needs_cc
@pytest.mark.parametrize("path", ["native", "avx2", "portable"])
def test_a_prompt_by_the_kernel_is_torchs_and_rolls_back_like_it(request, tmp_path, monkeypatch, path):
    """A prompt's mixer by `mamba_short` (keeping only the states a rollback reaches) leaves torch's states
    to float32 rounding, in one request and in a padded batch of prompts, and a truncate into the prompt's
    last positions restores what torch's restores."""
    from specctl.engine.checkpoint import write_random_model

    k = request.getfixturevalue(path)
    model_dir = write_random_model(tmp_path / "m", layer_kinds=("mamba", "full"), hidden_size=48,
                                   intermediate_size=64, mamba_d_state=16, mamba_head_dim=16, head_dim=16)
    ref = torch_runner_class(monkeypatch, k)(str(model_dir), page_size=4, max_tokens=1024, max_requests=4,
                                             max_draft_tokens=3)
    fast = ModelRunner(str(model_dir), page_size=4, max_tokens=1024, max_requests=4, max_draft_tokens=3)
    gen = torch.Generator().manual_seed(5)
    prompts = [torch.randint(3, 250, (n,), generator=gen).tolist() for n in (70, 9, 41)]
    m = fast.cache.mamba_index[0]
    for runner in (ref, fast):
        runner.allocate(0, 90)
        runner.forward([ForwardItem(0, prompts[0], 0)])  # alone
        for rid in (1, 2):
            runner.allocate(rid, 60)
        runner.forward([ForwardItem(rid, prompts[rid], 0) for rid in (1, 2)])  # padded to 41
    for rid in range(3):
        torch.testing.assert_close(fast.cache.ssm[m, fast.cache.requests[rid].slot],
                                   ref.cache.ssm[m, ref.cache.requests[rid].slot], rtol=1e-4, atol=1e-5)
    for runner in (ref, fast):  # back 3, 2 and 1 tokens into the prompts, then on from there
        for rid, back in enumerate((3, 2, 1)):
            runner.truncate(rid, len(prompts[rid]) - back)
    nxt = [ForwardItem(rid, [11, 12], len(prompts[rid]) - back) for rid, back in enumerate((3, 2, 1))]
    torch.testing.assert_close(fast.forward(nxt), ref.forward(nxt), rtol=1e-4, atol=1e-4)
    with pytest.raises(ValueError, match="keeps 1 .. 3 states"):
        k.mamba_short(torch.zeros(1, 2, 3), torch.zeros(1, 1, 1), torch.zeros(1, 1, 1, 1), [0], [2],
                      fast.model.model.layers[0].mixer._short_consts(), keep=4)


@needs_cc
@pytest.mark.parametrize("path", ["native", "avx2", "portable"])
def test_argmax_is_torchs_first_maximal_index_and_leaves_nan_to_torch(request, path):
    """The kernel's row-wise argmax gives torch's index for vocabularies around the 16-lane blocks, with ties
    (the first maximal index wins, also across lanes and the scalar tail), rows of -inf and +inf; a NaN makes
    it return None, and `sampling.greedy_ids` then asks torch (which ranks NaN highest)."""
    from specctl.engine.sampling import greedy_ids

    sg: smallgemm.SmallGemm = request.getfixturevalue(path)
    g = torch.Generator().manual_seed(5)
    for n in (1, 7, 15, 16, 17, 33, 260, 4096):
        x = torch.randn(9, n, generator=g)
        x[1] = x[1].round()  # many ties
        x[2] = -torch.inf
        x[3, n // 2] = torch.inf
        if n > 20:
            x[4, 3] = x[4, 19] = x[4, n - 1] = 50.0  # a tie across lanes and in the tail
            x[5, n - 1] = x[5, n - 2] = 60.0  # a tie in the tail only
        got = sg.argmax(x)
        assert got is not None and torch.equal(got, x.argmax(dim=-1)), n
        assert torch.equal(sg.argmax(x.view(3, 3, n)), x.view(3, 3, n).argmax(dim=-1))  # leading dims
    y = torch.randn(4, 40, generator=g)
    y[2, 30] = torch.nan
    assert sg.argmax(y) is None
    assert torch.equal(greedy_ids(y), y.argmax(dim=-1))
    with pytest.raises(ValueError, match="float32"):
        sg.argmax(y.double())
