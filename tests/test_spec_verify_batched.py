"""The batched rejection sampler equals the one-request-at-a-time algorithm, draw for draw.

`reference` is the textbook loop (Leviathan et al. 2023): per request, one uniform per draft from its
own generator, accept while u < min(1, p/q), then one inverse-CDF draw from the residual (or the bonus
row). `rejection_accept` batches everything after the uniforms; with the same generators it must emit
the same accepted counts and tokens, for deterministic (q = None) and sampling drafters, any mix of
draft lengths, and requests without a generator.
"""

from __future__ import annotations

import pytest
import torch

from specctl.engine.sampling import sample_from_probs
from specctl.engine.speculative.verify import rejection_accept


def reference(draft_tokens, num_drafts, p, q, generators):  # type: ignore[no-untyped-def]
    b, k1, _ = p.shape
    accepted, tokens = [], []
    for i in range(b):
        gen, n = generators[i], int(num_drafts[i])
        a = 0
        if n:
            u = torch.rand(n, generator=gen)
            while a < n:
                d = int(draft_tokens[i, a])
                qd = 1.0 if q is None else float(q[i, a, d])
                if float(u[a]) < min(1.0, float(p[i, a, d]) / max(qd, 1e-30)):
                    a += 1
                else:
                    break
        if a < n:
            qa = torch.zeros_like(p[i, a]).index_fill_(0, draft_tokens[i, a:a + 1], 1.0) if q is None else q[i, a]
            residual = (p[i, a] - qa).clamp(min=0.0)
            dist = residual / residual.sum() if float(residual.sum()) > 0 else p[i, a]
        else:
            dist = p[i, n]
        accepted.append(a)
        tokens.append([*draft_tokens[i, :a].tolist(), int(sample_from_probs(dist[None], [gen])[0])])
    return accepted, tokens


@pytest.mark.parametrize("seed", range(40))
def test_batched_rejection_sampling_equals_the_per_request_loop(seed):
    g = torch.Generator().manual_seed(seed)
    b, k, v = 1 + seed % 5, seed % 5, 11
    p = torch.softmax(torch.randn(b, k + 1, v, generator=g) * 2, -1)
    q = torch.softmax(torch.randn(b, k, v, generator=g) * 2, -1) if seed % 2 else None
    drafts = p[:, :k].argmax(-1) if seed % 3 == 0 else torch.randint(0, v, (b, k), generator=g)
    nd = torch.randint(0, k + 1, (b,), generator=g)

    def gens() -> list[torch.Generator | None]:
        return [torch.Generator().manual_seed(100 * seed + i) if (i + seed) % 4 else None for i in range(b)]

    torch.manual_seed(seed)
    want_acc, want_tok = reference(drafts, nd, p, q, gens())
    torch.manual_seed(seed)
    assert rejection_accept(drafts.tolist(), nd.tolist(), p, q, gens()) == (want_acc, want_tok)


@pytest.mark.parametrize("seed", range(12))
def test_batched_rejection_sampling_equals_the_loop_at_serving_shapes(seed):
    """Engine-sized blocks (vocab 260, up to 8 requests, up to 7 drafts, near-argmax drafts so that long
    prefixes get accepted): `rejection_accept` emits exactly what the per-request loop emits."""
    g = torch.Generator().manual_seed(seed)
    b, k, v = 1 + seed % 8, 1 + seed % 7, 260
    p = torch.softmax(torch.randn(b, k + 1, v, generator=g) * 3, -1)
    q = torch.softmax(torch.randn(b, k, v, generator=g) * 3, -1) if seed % 2 else None
    wild = torch.randint(0, v, (b, k), generator=g)
    drafts = torch.where(torch.rand(b, k, generator=g) < 0.8, p[:, :k].argmax(-1), wild)
    nd = torch.randint(0, k + 1, (b,), generator=g)

    def gens() -> list[torch.Generator | None]:
        return [torch.Generator().manual_seed(7 * seed + i) for i in range(b)]

    want = reference(drafts, nd, p, q, gens())
    assert rejection_accept(drafts.tolist(), nd.tolist(), p, q, gens()) == want


@pytest.mark.parametrize("seed", range(16))
def test_kernel_rejection_from_logits_equals_the_loop(seed):
    """Temperature-only rows (`rejection_accept_logits`, the small-row kernel from the target's logits): the
    accepted counts and tokens the per-request loop gets from p = softmax(logits / T), for sampling and
    deterministic drafters, any mix of draft lengths (0 included), temperatures per request."""
    from specctl.engine import smallgemm
    from specctl.engine.speculative.verify import rejection_accept_logits

    if smallgemm.kernel() is None:
        pytest.skip("no small-row kernel here (no C compiler, or SPECCTL_SMALL_GEMM=0)")
    g = torch.Generator().manual_seed(seed)
    b, k, v = 1 + seed % 8, 1 + seed % 7, 260
    logits = torch.randn(b, k + 1, v, generator=g) * 3
    temps = [0.5 + 0.25 * (i % 4) for i in range(b)]
    p = torch.softmax(logits / torch.tensor(temps)[:, None, None], -1)
    q = torch.softmax(torch.randn(b, k, v, generator=g) * 3, -1) if seed % 2 else None
    wild = torch.randint(0, v, (b, k), generator=g)
    drafts = torch.where(torch.rand(b, k, generator=g) < 0.8, p[:, :k].argmax(-1), wild)
    nd = torch.randint(0, k + 1, (b,), generator=g)

    def gens() -> list[torch.Generator]:
        return [torch.Generator().manual_seed(11 * seed + i) for i in range(b)]

    want = reference(drafts, nd, p, q, gens())
    got = rejection_accept_logits(drafts.tolist(), nd.tolist(), logits, temps, q, gens(),
                                  lambda: pytest.fail("torch's form ran where the kernel applies"))
    assert got == want
