"""Prefill's outbox: every room's payload goes out on its own, concurrently, on the lane of its decode session.

Contract: `TransferOutbox.submit(session, endpoint, key, room, tensors, ...)` returns a `concurrent.futures.Future`
that resolves to the room's `TransferResult` (acknowledged) or fails with its `TransferError`. Each decode session
has one lane: a thread that owns that session's `TransferSender` (one socket, one MAC key), hands each room's
payload to the socket as soon as it is submitted (at most `max_in_flight` rooms awaiting their ack per session; the
rest queue in order), and resolves each room when its own ack, refusal or deadline comes. So:

- a slow or dead decode costs only its own rooms: other sessions' lanes never wait on it;
- rooms of one session do not wait on each other's acks (they are pipelined on the socket);
- a session whose decode stopped pinging (`liveness(session)` older than `stale_after_s`, or `fail_session()`
  called when the bootstrap expired it) fails every room it holds at once, naming why, instead of one
  `transfer.timeout_s` each.

The caller keeps a room's tensors alive until its future resolves (the zmq backend sends them zero-copy; the job
holds a reference). Thread-safe: `submit`, `fail_session` and `close` may be called from any thread.
"""

from __future__ import annotations

import collections
import concurrent.futures
import contextlib
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from specctl.engine.pd import wire
from specctl.engine.pd.messages import PrefillResult
from specctl.engine.pd.transfer import TransferError, TransferResult, TransferSender

MAX_IN_FLIGHT = 32  # rooms of one session sent and awaiting their ack; the rest wait in the lane's queue
_POLL_S = 0.05


@dataclass
class _Job:
    room: str
    tensors: Mapping[str, Any]
    length: int
    result: PrefillResult | None
    future: concurrent.futures.Future[TransferResult] = field(default_factory=concurrent.futures.Future)


class _Lane:
    """One session's sender thread."""

    def __init__(self, outbox: TransferOutbox, session: str, endpoint: str, key: bytes | wire.Seal | None) -> None:
        self.outbox = outbox
        self.session = session
        self.endpoint = endpoint
        self.key = key
        self.queue: collections.deque[_Job] = collections.deque()
        self.in_flight: dict[str, _Job] = {}
        self.dead: str | None = None  # why every room of this session fails from now on
        self.wake = threading.Event()
        self.thread = threading.Thread(target=self._run, name=f"specctl-send-{session[:8]}", daemon=True)

    def _run(self) -> None:
        ob = self.outbox
        sender: TransferSender | None = None
        try:
            sender = ob.make_sender(self.endpoint, self.key)
            while True:
                # Outside the lock: the liveness lookup may expire sessions, whose callback fails lanes.
                age = ob.liveness(self.session) if ob.liveness is not None else 0.0
                with ob.lock:
                    if self.dead is None:
                        if age is None:
                            self.dead = "decode's session ended (its decode stopped pinging, or re-registered)"
                        elif age > ob.stale_after_s and (self.in_flight or self.queue):
                            self.dead = f"decode's session stopped pinging {age:.1f}s ago (decode stopped or gone)"
                    if self.dead is not None:
                        jobs = [*self.in_flight.values(), *self.queue]
                        self.in_flight.clear()
                        self.queue.clear()
                        if ob.lanes.get(self.session) is self:
                            del ob.lanes[self.session]
                        break
                    todo: list[_Job] = []
                    while self.queue and len(self.in_flight) + len(todo) < ob.max_in_flight:
                        todo.append(self.queue.popleft())
                    self.wake.clear()
                for job in todo:
                    self._submit(sender, job)
                if self.in_flight:
                    for res in sender.collect(_POLL_S):
                        self._resolve(res)
                else:
                    self.wake.wait(_POLL_S * 4)
        except BaseException as exc:  # a bug here must fail the rooms, not strand them
            reason = f"the sender for decode {self.endpoint} failed: {type(exc).__name__}: {exc}"
            with ob.lock:
                self.dead = self.dead or reason
                jobs = [*self.in_flight.values(), *self.queue]
                self.in_flight.clear()
                self.queue.clear()
                if ob.lanes.get(self.session) is self:
                    del ob.lanes[self.session]
        finally:
            if sender is not None:
                sender.close()
        for job in jobs:
            _fail(job, TransferError(f"request {job.room}: {self.dead}", request_id=job.room, field="session"))

    def _submit(self, sender: TransferSender, job: _Job) -> None:
        try:
            sender.submit(job.room, job.tensors, length=job.length, result=job.result)
        except TransferError as exc:
            _fail(job, exc)
            # submit() failing resets the connection: the rooms it had in flight are among collect()'s results
            return
        self.in_flight[job.room] = job

    def _resolve(self, res: TransferResult) -> None:
        job = self.in_flight.pop(res.request_id, None)
        if job is None:
            return
        if res.error is not None:
            _fail(job, res.error)
        else:
            with contextlib.suppress(concurrent.futures.InvalidStateError):  # the room's waiter gave up
                job.future.set_result(res)


def _fail(job: _Job, exc: BaseException) -> None:
    with contextlib.suppress(concurrent.futures.InvalidStateError):  # the room's waiter gave up
        job.future.set_exception(exc)


class TransferOutbox:
    """Per-session lanes of concurrent transfers (see the module docstring)."""

    def __init__(
        self,
        *,
        backend: str = "zmq",
        timeout_s: float = 30.0,
        liveness: Callable[[str], float | None] | None = None,
        stale_after_s: float = 3.0,
        max_in_flight: int = MAX_IN_FLIGHT,
        sender_factory: Callable[[str, bytes | wire.Seal | None], TransferSender] | None = None,
    ) -> None:
        self.backend = backend
        self.timeout_s = timeout_s
        self.liveness = liveness  # seconds since the session's last ping; None: the session is gone
        self.stale_after_s = stale_after_s
        self.max_in_flight = max(1, int(max_in_flight))
        self._factory = sender_factory
        self.lock = threading.Lock()
        self.lanes: dict[str, _Lane] = {}
        self._closed = False

    def make_sender(self, endpoint: str, key: bytes | wire.Seal | None) -> TransferSender:
        if self._factory is not None:
            return self._factory(endpoint, key)
        return TransferSender(endpoint, backend=self.backend, timeout_s=self.timeout_s, key=key)

    def submit(
        self,
        session: str,
        endpoint: str,
        key: bytes | wire.Seal | None,
        room: str,
        tensors: Mapping[str, Any],
        *,
        length: int,
        result: PrefillResult | None = None,
    ) -> concurrent.futures.Future[TransferResult]:
        """Queue one room's payload on its session's lane; the future resolves with its outcome."""
        job = _Job(room, tensors, length, result)
        with self.lock:
            if self._closed:
                _fail(job, TransferError(f"request {room}: prefill is shutting down", request_id=room,
                                         field="session"))
                return job.future
            lane = self.lanes.get(session)
            if lane is None or lane.endpoint != endpoint or lane.key != key:
                lane = self.lanes[session] = _Lane(self, session, endpoint, key)
                lane.thread.start()
            lane.queue.append(job)
            lane.wake.set()
        return job.future

    def fail_session(self, session: str, reason: str) -> None:
        """Fail every room of `session` now (its decode is gone); later rooms of it start a fresh lane."""
        with self.lock:
            lane = self.lanes.pop(session, None)
            if lane is not None and lane.dead is None:
                lane.dead = reason
                lane.wake.set()

    def in_flight(self) -> dict[str, int]:
        """Rooms per session that are queued or awaiting their ack (a metric)."""
        with self.lock:
            return {s: len(lane.in_flight) + len(lane.queue) for s, lane in self.lanes.items()}

    def close(self, timeout_s: float = 5.0) -> None:
        with self.lock:
            self._closed = True
            lanes = list(self.lanes.values())
            for lane in lanes:
                lane.dead = lane.dead or "prefill is shutting down"
                lane.wake.set()
        deadline = time.monotonic() + timeout_s
        for lane in lanes:
            lane.thread.join(max(0.0, deadline - time.monotonic()))
