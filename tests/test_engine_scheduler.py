"""Scheduler admission, chunking and preemption against the real ModelRunner's page pool."""

from __future__ import annotations

from pathlib import Path

import pytest

from specctl.engine.checkpoint import write_random_model
from specctl.engine.model_runner import ForwardItem, ModelRunner
from specctl.engine.sampling_params import SamplingParams
from specctl.engine.scheduler import Scheduler
from specctl.engine.sequence import Sequence, SequenceStatus

PAGE = 4


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_random_model(tmp_path_factory.mktemp("sched") / "m", layer_kinds=("full",))


def make(model_dir: Path, *, max_tokens: int, batch: int = 8, budget: int = 64) -> tuple[ModelRunner, Scheduler]:
    runner = ModelRunner(str(model_dir), page_size=PAGE, max_tokens=max_tokens, max_requests=batch)
    return runner, Scheduler(runner, page_size=PAGE, max_batch_size=batch, max_prefill_tokens=budget)


def seq(rid: int, prompt_len: int, max_tokens: int = 8) -> Sequence:
    return Sequence(rid, [65] * prompt_len, SamplingParams(max_tokens=max_tokens))


def finish_prefill(runner: ModelRunner, sched: Scheduler) -> None:
    """Play the engine's part for prefill: mark scheduled chunks cached (one real forward each)."""
    batch = sched.schedule()
    runner.forward([ForwardItem(c.seq.rid, c.seq.token_ids(c.start, c.end), c.start) for c in batch.prefill])
    for c in batch.prefill:
        c.seq.num_cached = c.end
        if c.completes:
            c.seq.status = SequenceStatus.RUNNING
            c.seq.output_ids.append(66)


def test_request_larger_than_pool_is_refused(model_dir: Path) -> None:
    runner, sched = make(model_dir, max_tokens=64)
    big = seq(0, 60, max_tokens=8)
    assert not sched.add(big)
    assert big.finish_reason == "error" and "64 tokens" in (big.error or "")
    assert sched.add(seq(1, 56, max_tokens=8))  # exactly the pool


def test_admission_is_fifo_and_bounded_by_pages(model_dir: Path) -> None:
    runner, sched = make(model_dir, max_tokens=64)  # 16 pages
    a, b, c = seq(0, 40), seq(1, 40), seq(2, 4)
    for s in (a, b, c):
        assert sched.add(s)
    batch = sched.schedule()
    # a takes 10 pages; b (10 more) does not fit, and c may not overtake it.
    assert [ch.seq.rid for ch in batch.prefill] == [0]
    assert list(sched.waiting) == [b, c]
    assert runner.num_free_pages == 6


def test_prefill_budget_chunks_long_prompts(model_dir: Path) -> None:
    runner, sched = make(model_dir, max_tokens=256, budget=16)
    sched.add(seq(0, 40))
    sched.add(seq(1, 10))
    spans = []
    for _ in range(4):
        batch = sched.schedule()
        spans.append([(ch.seq.rid, ch.start, ch.end) for ch in batch.prefill])
        runner.forward([ForwardItem(ch.seq.rid, ch.seq.token_ids(ch.start, ch.end), ch.start) for ch in batch.prefill])
        for ch in batch.prefill:
            ch.seq.num_cached = ch.end
            if ch.completes:
                ch.seq.status = SequenceStatus.RUNNING
                ch.seq.output_ids.append(66)
    assert spans[0] == [(0, 0, 16)]
    assert spans[1] == [(0, 16, 32)]
    assert spans[2] == [(0, 32, 40), (1, 0, 8)]
    assert spans[3] == [(1, 8, 10)]


def test_batch_size_caps_admission(model_dir: Path) -> None:
    runner, sched = make(model_dir, max_tokens=256, batch=2)
    for i in range(4):
        sched.add(seq(i, 4))
    batch = sched.schedule()
    assert len(batch.prefill) == 2 and len(sched.waiting) == 2


def test_exhaustion_preempts_the_newest(model_dir: Path) -> None:
    runner, sched = make(model_dir, max_tokens=32)  # 8 pages
    old, new = seq(0, 12, max_tokens=20), seq(1, 12, max_tokens=20)
    sched.add(old)
    sched.add(new)
    finish_prefill(runner, sched)  # both hold 3 pages; 2 free (headroom for both to grow one page each)
    assert [s.status for s in (old, new)] == [SequenceStatus.RUNNING] * 2
    # Grow both to 16 tokens: 4 pages each = the whole pool; the next growth must preempt.
    for s in (old, new):
        s.output_ids.extend([66] * 4)
        assert runner.ensure_capacity(s.rid, len(s) - 1)
    batch = sched.schedule()
    assert batch.preempted == [new] and batch.decode == [old]
    assert new.status is SequenceStatus.WAITING and sched.waiting[0] is new and new.num_preemptions == 1
    assert new.prefill_target == len(new) - 1  # recompute prompt + output but the newest token


def test_lone_request_that_cannot_grow_fails_clearly(model_dir: Path) -> None:
    runner, sched = make(model_dir, max_tokens=32)
    s = seq(0, 12, max_tokens=20)
    sched.add(s)
    finish_prefill(runner, sched)
    runner.allocate(999, 4 * PAGE)  # someone else holds the rest of the pool
    s.output_ids.extend([66] * 4)
    batch = sched.schedule()
    assert batch.failed == [s] and s.finish_reason == "error" and "exhausted" in (s.error or "")
    assert not sched.running
