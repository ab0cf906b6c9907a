"""Sampling oracles: greedy is argmax; filters keep exactly the right tokens; draws follow the
distribution; a row's draws depend only on its own seed, never on the rest of the batch."""

from __future__ import annotations

import math

import pytest
import torch

from specctl.engine.sampling import (
    SamplingParams,
    make_generator,
    probs_from_logits,
    sample,
    sample_from_probs,
)
from specctl.errors import InvalidInput


def _logits(n: int = 4, vocab: int = 50, seed: int = 0) -> torch.Tensor:
    return torch.randn(n, vocab, generator=torch.Generator().manual_seed(seed)) * 3


def test_greedy_rows_are_argmax() -> None:
    logits = _logits()
    params = [SamplingParams()] * 4
    assert torch.equal(sample(logits, params, [None] * 4), logits.argmax(-1))


def test_temperature_scales_distribution() -> None:
    logits = _logits(1)
    p = probs_from_logits(logits, [SamplingParams(temperature=0.5)])
    assert torch.allclose(p, torch.softmax(logits / 0.5, -1), atol=1e-6)


def test_top_k_keeps_the_k_largest() -> None:
    logits = _logits(1)
    p = probs_from_logits(logits, [SamplingParams(temperature=1.0, top_k=5)])[0]
    kept = set(torch.nonzero(p).flatten().tolist())
    assert kept == set(torch.topk(logits[0], 5).indices.tolist())
    assert math.isclose(float(p.sum()), 1.0, rel_tol=1e-5)


def test_top_p_keeps_smallest_prefix_reaching_mass() -> None:
    logits = torch.log(torch.tensor([[0.5, 0.3, 0.15, 0.05]]))
    # 0.5 < 0.7, 0.5 + 0.3 >= 0.7: exactly the first two survive, renormalised.
    p = probs_from_logits(logits, [SamplingParams(temperature=1.0, top_p=0.7)])[0]
    assert torch.allclose(p, torch.tensor([0.625, 0.375, 0.0, 0.0]), atol=1e-6)
    # The most likely token always survives, however small top_p is.
    p = probs_from_logits(logits, [SamplingParams(temperature=1.0, top_p=0.01)])[0]
    assert torch.allclose(p, torch.tensor([1.0, 0.0, 0.0, 0.0]))


def test_per_row_parameters_in_one_batch() -> None:
    logits = _logits(3)
    params = [SamplingParams(), SamplingParams(temperature=1.0, top_k=2), SamplingParams(temperature=2.0)]
    p = probs_from_logits(logits, params)
    assert int(p[0].argmax()) == int(logits[0].argmax()) and float(p[0].max()) == 1.0
    assert int((p[1] > 0).sum()) == 2
    assert torch.allclose(p[2], torch.softmax(logits[2] / 2.0, -1), atol=1e-6)


def test_draws_follow_the_distribution() -> None:
    # Chi-square goodness of fit, 5 categories (4 dof): critical value 18.47 at alpha = 0.001.
    probs = torch.tensor([0.4, 0.3, 0.15, 0.1, 0.05])
    n = 4000
    gens = [torch.Generator().manual_seed(1234 + i) for i in range(n)]
    ids = sample_from_probs(probs.expand(n, -1).contiguous(), gens)
    counts = torch.bincount(ids, minlength=5).double()
    expected = probs.double() * n
    chi2 = float(((counts - expected) ** 2 / expected).sum())
    assert chi2 < 18.47, (counts.tolist(), chi2)


def test_zero_probability_tokens_never_drawn() -> None:
    probs = torch.tensor([[0.0, 0.5, 0.0, 0.5, 0.0]]).expand(500, -1).contiguous()
    ids = sample_from_probs(probs, [torch.Generator().manual_seed(i) for i in range(500)])
    assert set(ids.tolist()) <= {1, 3}


def _spy_kernel_sample(monkeypatch: pytest.MonkeyPatch) -> list[bool]:
    """Per call of the small-row kernel's `sample`, whether it answered (False: it declined, None); the calls
    still run. Skips where the kernel does not build."""
    from specctl.engine import smallgemm

    if smallgemm.kernel() is None:
        pytest.skip("no small-row kernel here (no C compiler, or SPECCTL_SMALL_GEMM=0)")
    calls: list[bool] = []
    real = smallgemm.SmallGemm.sample

    def spy(self: smallgemm.SmallGemm, *args: object) -> torch.Tensor | None:
        out = real(self, *args)  # type: ignore[arg-type]
        calls.append(out is not None)
        return out

    monkeypatch.setattr(smallgemm.SmallGemm, "sample", spy)
    return calls


@pytest.mark.parametrize("seed", range(12))
def test_the_kernel_draws_what_the_torch_path_draws(seed: int, monkeypatch: pytest.MonkeyPatch) -> None:
    """Temperature-only rows of float32 CPU logits (greedy rows among them) are drawn by the small-row
    kernel (one call, which answers); with the same generators it picks the tokens softmax + inverse CDF in
    torch pick."""
    calls = _spy_kernel_sample(monkeypatch)
    logits = _logits(8, vocab=260, seed=seed)
    params = [SamplingParams(temperature=0.4 + 0.2 * i, seed=100 * seed + i) if (i + seed) % 3 else SamplingParams()
              for i in range(8)]
    got = sample(logits, params, [make_generator(p, "cpu") for p in params])
    assert calls == [True]
    want = sample_from_probs(probs_from_logits(logits, params), [make_generator(p, "cpu") for p in params])
    assert got.tolist() == want.tolist()


def test_a_nan_in_a_greedy_row_takes_torchs_path_with_the_same_draws(monkeypatch: pytest.MonkeyPatch) -> None:
    """The kernel's argmax declines a NaN (torch ranks it highest); sampling then answers as torch does, the
    sampled rows with the uniforms already drawn."""
    calls = _spy_kernel_sample(monkeypatch)
    logits = _logits(3, vocab=260, seed=5)
    logits[1, 7] = float("nan")
    params = [SamplingParams(temperature=0.8, seed=1), SamplingParams(), SamplingParams(temperature=1.2, seed=2)]
    got = sample(logits, params, [make_generator(p, "cpu") for p in params])
    assert calls == [False]  # asked, and declined
    want = sample_from_probs(probs_from_logits(logits, params), [make_generator(p, "cpu") for p in params])
    assert got.tolist() == want.tolist() and int(got[1]) == 7


def test_seeded_row_is_batch_invariant() -> None:
    logits = _logits(4)
    p = SamplingParams(temperature=1.0, seed=7)
    alone = [int(sample(logits[2:3], [p], [make_generator(p, "cpu")])) for _ in range(1)]
    others = [SamplingParams(temperature=1.0, seed=s) for s in (1, 2, 3)]
    params = [others[0], others[1], p, others[2]]
    gens = [make_generator(q, "cpu") for q in params]
    batched = sample(logits, params, gens).tolist()
    assert batched[2] == alone[0]


def test_same_seed_same_stream_different_seed_differs() -> None:
    logits = _logits(1, vocab=1000)

    def draws(seed: int) -> list[int]:
        p = SamplingParams(temperature=1.0, seed=seed)
        gen = make_generator(p, "cpu")
        return [int(sample(logits, [p], [gen])) for _ in range(20)]

    assert draws(5) == draws(5)
    assert draws(5) != draws(6)


def test_greedy_requests_get_no_generator() -> None:
    assert make_generator(SamplingParams(), "cpu") is None
    assert make_generator(SamplingParams(temperature=0.8, top_k=1), "cpu") is None


@pytest.mark.parametrize(
    "kwargs",
    [
        {"max_tokens": 0},
        {"max_tokens": True},
        {"temperature": -0.1},
        {"top_k": -1},
        {"top_p": 0.0},
        {"top_p": 1.5},
        {"seed": "x"},
        {"stop": [""]},
    ],
)
def test_invalid_params_are_input_errors(kwargs: dict) -> None:
    with pytest.raises(InvalidInput):
        SamplingParams(**kwargs)


def test_stop_accepts_a_string_or_list() -> None:
    assert SamplingParams(stop="x").stop == ("x",)
    assert SamplingParams(stop=["a", "b"]).stop == ("a", "b")
