"""Scheduler: which requests run this step, bounded by free cache pages.

Contract (continuous batching; requests join and leave every step):
- `add(seq)` queues a request, or finishes it at once with a clear error when it can never fit the
  pool (`prompt + max_tokens` tokens, plus the decoder's lookahead, exceed the whole pool).
- `schedule()` returns one `Batch` per engine step with two parts:
  * `decode`: every decoding request (at most `max_batch_size` are ever admitted). Before it is
    returned, each has cache capacity for `lookahead` more tokens. When the pool runs dry, the
    newest admitted request is preempted (its cache freed; it goes back to the front of the queue
    and is recomputed later), repeatedly, so older requests keep going; a request alone in the pool
    that still cannot grow is failed with an error (not possible when `add` accepted it).
  * `prefill`: chunks of prompts, at most `max_prefill_tokens` tokens in all. Partially prefilled
    requests continue first; then queued requests are admitted in FIFO order while the batch has
    room and the pool can hold the whole prompt plus one page of growth per decoding request (so a
    new admission does not immediately force a preemption).
- `finish(seq, reason)` and `abort(rid)` free the request's cache.

The scheduler talks to the cache only through the runner's cache verbs (`pages_needed`,
`can_allocate`, `allocate`, `ensure_capacity`, `free`, `num_free_pages`, `num_total_pages`).
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field
from typing import Protocol

from specctl.engine.sequence import Sequence, SequenceStatus


class PagePool(Protocol):
    """The subset of ModelRunner the scheduler uses."""

    @property
    def num_free_pages(self) -> int: ...

    @property
    def num_total_pages(self) -> int: ...

    def pages_needed(self, num_tokens: int) -> int: ...

    def can_allocate(self, num_tokens: int) -> bool: ...

    def allocate(self, rid: int, num_tokens: int) -> None: ...

    def ensure_capacity(self, rid: int, num_tokens: int) -> bool: ...

    def free(self, rid: int) -> None: ...


@dataclass(frozen=True)
class PrefillChunk:
    """Tokens [start, end) of `seq` to write into the cache this step."""

    seq: Sequence
    start: int
    end: int

    @property
    def completes(self) -> bool:
        return self.end == self.seq.prefill_target


@dataclass
class Batch:
    prefill: list[PrefillChunk] = field(default_factory=list)
    decode: list[Sequence] = field(default_factory=list)
    preempted: list[Sequence] = field(default_factory=list)  # freed and requeued this step
    failed: list[Sequence] = field(default_factory=list)  # finished with an error this step

    @property
    def empty(self) -> bool:
        return not (self.prefill or self.decode)


class Scheduler:
    def __init__(
        self, pool: PagePool, *, page_size: int, max_batch_size: int, max_prefill_tokens: int, lookahead: int = 1
    ) -> None:
        self.pool = pool
        self.page_size = page_size
        self.max_batch_size = max_batch_size
        self.max_prefill_tokens = max_prefill_tokens
        # Cache slots one decode step may write per request beyond its cached length (plain: 1,
        # speculative: largest steps + 1).
        self.lookahead = lookahead
        self.waiting: deque[Sequence] = deque()
        self.running: list[Sequence] = []  # admitted (prefilling or decoding), oldest first
        self.num_preemptions = 0

    # -- queue ---------------------------------------------------------------------------------
    def max_request_tokens(self) -> int:
        """The largest prompt + max_tokens a request may ask for (the whole pool, less lookahead)."""
        return self.pool.num_total_pages * self.page_size - (self.lookahead - 1)

    def add(self, seq: Sequence) -> bool:
        """Queue `seq`; False (and `seq` finished with an error) when it can never fit."""
        need = len(seq.prompt_ids) + seq.params.max_tokens + self.lookahead - 1
        if self.pool.pages_needed(need) > self.pool.num_total_pages:
            limit = self.max_request_tokens()
            seq.finish(
                "error",
                f"request needs {len(seq.prompt_ids)} prompt + {seq.params.max_tokens} new tokens, but the "
                f"KV cache pool holds at most {limit} tokens per request; lower max_tokens, shorten the "
                f"prompt, or raise cache.max_tokens",
            )
            return False
        self.waiting.append(seq)
        return True

    def has_work(self) -> bool:
        return bool(self.waiting or self.running)

    def finish(self, seq: Sequence, reason: str, error: str | None = None) -> None:
        self.pool.free(seq.rid)
        if seq in self.running:
            self.running.remove(seq)
        seq.finish(reason, error)

    def abort(self, rid: int) -> Sequence | None:
        for seq in list(self.waiting):
            if seq.rid == rid:
                self.waiting.remove(seq)
                seq.finish("abort")
                return seq
        for seq in self.running:
            if seq.rid == rid:
                self.finish(seq, "abort")
                return seq
        return None

    # -- one step ------------------------------------------------------------------------------
    def schedule(self) -> Batch:
        batch = Batch()
        self._schedule_decode(batch)
        self._schedule_prefill(batch)
        return batch

    def _schedule_decode(self, batch: Batch) -> None:
        for seq in [s for s in self.running if s.status is SequenceStatus.RUNNING]:
            if seq.status is not SequenceStatus.RUNNING:
                continue  # preempted earlier in this loop to make room for an older request
            need = len(seq) - 1 + self.lookahead
            while not self.pool.ensure_capacity(seq.rid, need):
                victim = self.running[-1]
                if victim is seq and len(self.running) == 1:
                    self.finish(
                        seq,
                        "error",
                        f"KV cache pool exhausted: request {seq.rid} needs {need} tokens and is alone in a pool "
                        f"of {self.pool.num_total_pages} pages; raise cache.max_tokens",
                    )
                    batch.failed.append(seq)
                    break
                self._preempt(victim, batch)
                if victim is seq:
                    break
            else:
                batch.decode.append(seq)

    def _schedule_prefill(self, batch: Batch) -> None:
        budget = self.max_prefill_tokens
        for seq in self.running:
            if budget <= 0:
                return
            if seq.status is SequenceStatus.PREFILLING:
                end = min(seq.prefill_target, seq.num_cached + budget)
                batch.prefill.append(PrefillChunk(seq, seq.num_cached, end))
                budget -= end - seq.num_cached
        # One page of growth per decoding request stays free, so admitting does not force a preemption
        # on the next step.
        headroom = sum(1 for s in self.running if s.status is SequenceStatus.RUNNING)
        while self.waiting and budget > 0 and len(self.running) < self.max_batch_size:
            seq = self.waiting[0]
            target = seq.prefill_target
            fits = self.pool.can_allocate(target) and (
                self.pool.pages_needed(target) + headroom <= self.pool.num_free_pages
            )
            if not fits:
                if not self.running and not batch.prefill:
                    # Nothing holds pages, yet it does not fit: it never will (add() should prevent this).
                    self.waiting.popleft()
                    seq.finish("error", f"request {seq.rid} does not fit an empty KV cache pool ({target} tokens)")
                    batch.failed.append(seq)
                    continue
                return  # FIFO: wait for pages rather than let later requests overtake
            self.waiting.popleft()
            self.pool.allocate(seq.rid, target)
            seq.status = SequenceStatus.PREFILLING
            seq.num_cached = 0
            self.running.append(seq)
            end = min(target, budget)
            batch.prefill.append(PrefillChunk(seq, 0, end))
            budget -= end

    def _preempt(self, seq: Sequence, batch: Batch) -> None:
        self.pool.free(seq.rid)
        self.running.remove(seq)
        seq.status = SequenceStatus.WAITING
        seq.num_cached = 0
        seq.num_preemptions += 1
        self.num_preemptions += 1
        # Front of the queue: it is older than anything still waiting.
        self.waiting.appendleft(seq)
        batch.preempted.append(seq)
