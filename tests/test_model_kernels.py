"""Oracles for the serving path's fast kernels: each must compute what the reference form computes.

- `causal_conv` (unfold + multiply-add) == `F.conv1d` with groups == channels (the cache-free forward's);
- `ssd_short` (every per-position state of a verify, inputs formed at once) == the recurrence `ssd_step`
  run position by position, states and outputs, including padding (dt = 0) positions;
- `PackedLinear` (the small-row kernel up to `small_max_rows` rows, oneDNN's prepacked one past them) ==
  `F.linear` at every row count;
- `rotary` (one roll and the sign-folded sin table) == Llama's rotate-half with plain cos and sin, exactly;
- a verify forward of k + 1 positions on the hybrid model == k + 1 single-token decodes, for every k the
  builtin deployments verify (the cache path that speculation uses, against the plain decode path).
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from specctl.engine import smallgemm
from specctl.engine.checkpoint import write_random_model
from specctl.engine.model import (
    causal_conv,
    rope_cos_sin,
    rope_table,
    rotary,
    ssd_short,
    ssd_step,
)
from specctl.engine.model_runner import ForwardItem, ModelRunner
from specctl.engine.ops import (
    PACKED_LARGE_ELEMENTS,
    PACKED_MIN_ROWS,
    PACKED_MIN_ROWS_LARGE,
    SMALL_MAX_ROWS,
    PackedLinear,
    can_pack,
    small_max_rows,
)

_KERNEL = smallgemm.kernel()
CAP = small_max_rows(_KERNEL) if _KERNEL is not None else SMALL_MAX_ROWS  # this machine's small-kernel row cap


@pytest.mark.parametrize("length", [1, 2, 5, 9])
def test_causal_conv_equals_grouped_conv1d(length):
    g = torch.Generator().manual_seed(length)
    c, k = 24, 4
    xcat = torch.randn(3, c, k - 1 + length, generator=g)
    w, b = torch.randn(c, 1, k, generator=g), torch.randn(c, generator=g)
    torch.testing.assert_close(causal_conv(xcat, w, b), F.conv1d(xcat, w, b, groups=c), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("shape", [(1, 1, 4, 64), (2, 5, 3, 32), (8, 4, 1, 16)])
def test_rotary_equals_rotate_half(shape):
    g = torch.Generator().manual_seed(shape[1])
    b, n, _, d = shape
    x = torch.randn(*shape, generator=g)
    inv_freq = 1.0 / (10000.0 ** (torch.arange(0, d, 2, dtype=torch.float32) / d))
    positions = torch.randint(0, 300, (b, n), generator=g)
    cos, sin = rope_cos_sin(positions, rope_table(inv_freq, 300))
    freqs = positions[..., None].float() * inv_freq
    emb = torch.cat((freqs, freqs), dim=-1)[:, :, None, :]
    half = d // 2
    rotate_half = torch.cat((-x[..., half:], x[..., :half]), dim=-1)
    reference = x * emb.cos() + rotate_half * emb.sin()
    assert torch.equal(rotary(x, (cos, sin)), reference)


@pytest.mark.parametrize("q", [1, 2, 4, 8])
def test_short_scan_equals_the_recurrence(q):
    g = torch.Generator().manual_seed(q)
    b, h, p, n = 3, 4, 6, 5
    x = torch.randn(b, q, h, p, generator=g)
    dt = torch.rand(b, q, h, generator=g) * 0.5
    dt[1, q // 2 :] = 0.0  # a shorter item padded in the group: its padding must leave the state alone
    A = -torch.rand(h, generator=g) * 3
    bm, cm = torch.randn(b, q, n, generator=g), torch.randn(b, q, n, generator=g)
    h0 = torch.randn(b, h, p, n, generator=g)
    y, states = ssd_short(x, dt, A, bm, cm, h0)
    state, ys, ref = h0, [], []
    for t in range(q):
        yt, state = ssd_step(x[:, t], dt[:, t], A, bm[:, t], cm[:, t], state)
        ys.append(yt)
        ref.append(state)
    torch.testing.assert_close(y, torch.stack(ys, 1), rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(states, torch.stack(ref, 1), rtol=1e-5, atol=1e-5)
    if q > 1:  # padding positions repeat the last real state
        torch.testing.assert_close(states[1, -1], states[1, q // 2 - 1])


@pytest.mark.skipif(not can_pack(torch.zeros(1, 1)), reason="this torch build has no oneDNN fp32 packing")
@pytest.mark.parametrize("rows", [PACKED_MIN_ROWS_LARGE - 1, PACKED_MIN_ROWS_LARGE, PACKED_MIN_ROWS_LARGE + 1])
def test_a_large_weight_packs_from_fewer_rows_and_computes_the_same(rows):
    g = torch.Generator().manual_seed(rows)
    w = torch.randn(PACKED_LARGE_ELEMENTS // 256, 256, generator=g)
    lin = PackedLinear(w, None)
    assert lin.min_rows == PACKED_MIN_ROWS_LARGE < PACKED_MIN_ROWS == PackedLinear(w[:8], None).min_rows
    x = torch.randn(rows, 256, generator=g)
    torch.testing.assert_close(lin(x), F.linear(x, w), rtol=1e-4, atol=1e-4)


@pytest.mark.skipif(not can_pack(torch.zeros(1, 1)), reason="this torch build has no oneDNN fp32 packing")
@pytest.mark.parametrize("rows", sorted({1, PACKED_MIN_ROWS - 1, PACKED_MIN_ROWS, SMALL_MAX_ROWS, SMALL_MAX_ROWS + 1,
                                         CAP, CAP + 1, 3 * CAP + 1}))
@pytest.mark.parametrize("bias", [False, True])
def test_packed_linear_equals_f_linear(rows, bias):
    g = torch.Generator().manual_seed(rows)
    w = torch.randn(48, 32, generator=g)
    b = torch.randn(48, generator=g) if bias else None
    x = torch.randn(2, rows, 32, generator=g)
    lin = PackedLinear(w, b)
    torch.testing.assert_close(lin(x), F.linear(x, w, b), rtol=1e-5, atol=1e-5)


@pytest.fixture(scope="module")
def runner(tmp_path_factory: pytest.TempPathFactory) -> ModelRunner:
    d = write_random_model(tmp_path_factory.mktemp("k") / "m", layer_kinds=("mamba", "swa", "full", "mamba"),
                           sliding_window=5)
    return ModelRunner(str(d), page_size=4, max_tokens=4096, max_requests=CAP + 8, max_draft_tokens=7)


@pytest.mark.parametrize("k", [1, 3, 7])
def test_verify_forward_equals_single_token_decodes(runner, k):
    g = torch.Generator().manual_seed(k)
    prompt = torch.randint(0, 256, (20,), generator=g).tolist()
    new = torch.randint(0, 256, (k + 1,), generator=g).tolist()
    for rid in (1, 2):
        runner.allocate(rid, 64)
        runner.forward([ForwardItem(rid, prompt, 0)])
    verify = runner.forward([ForwardItem(1, new, len(prompt))])
    steps = torch.cat([runner.forward([ForwardItem(2, [t], len(prompt) + i)]) for i, t in enumerate(new)])
    torch.testing.assert_close(verify, steps, rtol=1e-4, atol=1e-4)
    runner.free(1)
    runner.free(2)


def test_large_batch_decode_equals_each_alone(runner):
    """A batch past the small kernel's rows (oneDNN's packed kernels) == each request decoded on its own."""
    bs = CAP + 3
    g = torch.Generator().manual_seed(7)
    prompts = [torch.randint(0, 256, (5 + i,), generator=g).tolist() for i in range(bs)]
    for rid, p in enumerate(prompts):
        runner.allocate(100 + rid, 32)
        runner.forward([ForwardItem(100 + rid, p, 0)])
    batch = runner.forward([ForwardItem(100 + r, [7], len(p)) for r, p in enumerate(prompts)])
    for r, p in enumerate(prompts):
        runner.truncate(100 + r, len(p))
    alone = torch.cat([runner.forward([ForwardItem(100 + r, [7], len(p))]) for r, p in enumerate(prompts)])
    torch.testing.assert_close(batch, alone, rtol=1e-4, atol=1e-4)
    for r in range(bs):
        runner.free(100 + r)


@pytest.mark.skipif(not can_pack(torch.zeros(1, 1)), reason="this torch build has no oneDNN fp32 packing")
def test_packed_linear_follows_in_place_weight_updates():
    w = torch.randn(48, 32)
    lin = PackedLinear(w, None)
    x = torch.randn(PACKED_MIN_ROWS, 32)
    with torch.no_grad():
        w.mul_(2.0)  # e.g. a test perturbing a loaded model's weights
    torch.testing.assert_close(lin(x), F.linear(x, w), rtol=1e-5, atol=1e-5)
