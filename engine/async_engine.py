"""AsyncEngine: the synchronous Engine loop on one background thread, fed from asyncio.

Contract:
- The wrapped engine (`engine.Engine`, or anything with `add_request(ids, params) -> rid`,
  `step() -> list[Sequence]`, `abort(rid)`, `stats() -> dict`) is touched ONLY by the engine thread,
  so it needs no locks. Everything else talks to it through a thread-safe inbox.
- `generate(...)` is an async iterator of `RequestOutput` deltas for one request; tokens arrive on a
  per-request asyncio queue filled with `loop.call_soon_threadsafe` after every engine step.
- Leaving the iterator early (client disconnect, cancellation, exception) aborts the request in the
  engine, which frees its pages. A failed `step()` fails every in-flight request with the error (their
  pages freed by abort) and the loop keeps serving.
- `call(fn)` runs `fn(engine)` on the engine thread (imports of transferred requests, stats snapshots).
- A request admitted with `export_after_prefill` (the PD prefill role) gets its export (`PrefillExport`: caches,
  first token, random stream, prefill timings) on its final delta, `RequestOutput.prefilled`.
"""

from __future__ import annotations

import asyncio
import collections
import concurrent.futures
import dataclasses
import logging
import queue
import threading
import time
from collections.abc import AsyncIterator, Callable, Sequence
from typing import TYPE_CHECKING, Any, TypeVar

if TYPE_CHECKING:  # the engine modules import torch; this one stays light (the HTTP front imports it)
    from specctl.engine.engine import Engine
    from specctl.engine.logprobs import TokenLogprob
    from specctl.engine.prefill_export import PrefillExport
    from specctl.engine.sampling_params import SamplingParams
    from specctl.engine.sequence import Sequence as EngineSequence

log = logging.getLogger("specctl.async_engine")

T = TypeVar("T")


@dataclasses.dataclass
class RequestOutput:
    """One delta of a request's stream. `token_ids` are the tokens new since the previous delta."""

    token_ids: list[int]
    finished: bool = False
    finish_reason: str | None = None  # "stop" | "length" | "abort" | "error" (OpenAI's names where they exist)
    error: str | None = None
    completion_tokens: int = 0  # total generated so far
    accept_lengths: list[int] = dataclasses.field(default_factory=list)  # per verify step (final delta only)
    timings: dict[str, float] = dataclasses.field(default_factory=dict)
    text: str | None = None  # the engine's full text so far (cut at a stop string); final delta only
    logprobs: list[TokenLogprob | None] | None = None  # one (None: not known) per new token, when the request asked
    # HTTP status of an error: None is a server-side failure (503); 408 is a PD room whose other half never came,
    # which a direct client causes by posting to one side only (the router always posts to both)
    error_status: int | None = None
    # A request admitted with `export_after_prefill` (PD prefill role): its caches, first token, random stream
    # and prefill timings, handed over with its final delta (finish_reason "prefilled")
    prefilled: PrefillExport | None = None


@dataclasses.dataclass(eq=False)
class _Stream:
    loop: asyncio.AbstractEventLoop
    queue: asyncio.Queue[RequestOutput]
    admit: Callable[[Engine], int | EngineSequence]
    sent: int = 0
    rid: int | None = None
    done: bool = False
    cancelled: bool = False
    coalesce: bool = False  # deliver the first tokens and the end only (see AsyncEngine.generate)
    arrival: float = dataclasses.field(default_factory=time.monotonic)

    def push(self, item: RequestOutput) -> None:
        try:
            self.loop.call_soon_threadsafe(self.queue.put_nowait, item)
        except RuntimeError:  # the event loop is closed: nobody is listening any more
            pass


class AsyncEngine:
    """Runs `engine` on a daemon thread; async callers submit, stream, abort and call into it."""

    def __init__(self, engine: Engine, *, name: str = "engine", idle_poll_s: float = 0.1) -> None:
        self.engine = engine
        self._inbox: queue.Queue[tuple[str, Any]] = queue.Queue()
        self._live: dict[int, _Stream] = {}
        self._stop = threading.Event()
        self._idle_poll_s = idle_poll_s
        self._thread = threading.Thread(target=self._run, name=f"specctl-{name}", daemon=True)
        self.step_times: collections.deque[float] = collections.deque(maxlen=512)
        self.steps = 0
        self.failed_steps = 0
        self.last_error: str | None = None
        # Deltas of one step, handed to each event loop in ONE thread-safe call (one wake-up of the loop, not
        # one per request: at batch 8 that is 8x fewer self-pipe writes and GIL hand-overs per step).
        self._outbox: dict[asyncio.AbstractEventLoop, list[tuple[_Stream, RequestOutput]]] = {}

    # lifecycle ------------------------------------------------------------------------------------
    def start(self) -> AsyncEngine:
        self._thread.start()
        return self

    def stop(self, timeout: float = 5.0) -> None:
        self._stop.set()
        self._inbox.put(("wake", None))
        if self._thread.is_alive():
            self._thread.join(timeout)

    @property
    def alive(self) -> bool:
        return self._thread.is_alive()

    @property
    def num_live(self) -> int:
        return len(self._live)

    # async API ------------------------------------------------------------------------------------
    async def generate(
        self,
        prompt_ids: Sequence[int],
        params: SamplingParams,
        *,
        admit: Callable[[Engine], int | EngineSequence] | None = None,
        coalesce: bool = False,
    ) -> AsyncIterator[RequestOutput]:
        """Stream one request. `admit(engine)` replaces `engine.add_request(ids, params)`: it returns the
        rid, or the admitted Sequence itself, whose tokens so far are emitted at once (decode imports a
        transferred request, with prefill's first token, this way).

        `coalesce` is for a caller that answers once, at the end (a non-streaming HTTP request): it gets
        the first delta (its time is the request's TTFT) and then one delta with every later token, at the
        finish. The tokens and their order are the same; only the hand-overs between the engine thread
        and the event loop go (at batch 8 on two cores, one per request per step cost a fifth of the
        served throughput: the loop's work for them holds the GIL the engine thread's next step needs)."""
        loop = asyncio.get_running_loop()
        ids = list(prompt_ids)
        stream = _Stream(loop=loop, queue=asyncio.Queue(), admit=admit or (lambda eng: eng.add_request(ids, params)),
                         coalesce=coalesce)
        self._inbox.put(("add", stream))
        try:
            while True:
                item: RequestOutput = await stream.queue.get()
                yield item
                if item.finished:
                    stream.done = True
                    return
        finally:
            if not stream.done:
                # Client went away or the consumer failed: free the request's pages in the engine.
                stream.cancelled = True
                self._inbox.put(("abort", stream))

    async def call(self, fn: Callable[[Engine], T], timeout: float | None = 30.0) -> T:
        """Run `fn(engine)` on the engine thread and return its result (exceptions propagate)."""
        fut: concurrent.futures.Future[T] = concurrent.futures.Future()
        self._inbox.put(("call", (fn, fut)))
        return await asyncio.wait_for(asyncio.wrap_future(fut), timeout)

    def call_sync(self, fn: Callable[[Engine], T], timeout: float | None = 30.0) -> T:
        fut: concurrent.futures.Future[T] = concurrent.futures.Future()
        self._inbox.put(("call", (fn, fut)))
        return fut.result(timeout)

    # engine thread --------------------------------------------------------------------------------
    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                block = not self._live
                cmd = self._inbox.get(timeout=self._idle_poll_s) if block else self._inbox.get_nowait()
            except queue.Empty:
                cmd = None
            if cmd is not None:
                self._handle(cmd)
                # Drain everything queued so one step admits every waiting request (continuous batching).
                while True:
                    try:
                        self._handle(self._inbox.get_nowait())
                    except queue.Empty:
                        break
                self._flush()
            if self._live and not self._stop.is_set():
                self._step()
                self._flush()
        # Shutting down: fail whatever is still streaming so no client waits forever.
        for stream in list(self._live.values()):
            stream.push(RequestOutput([], True, "error", "server shutting down", stream.sent))
        self._live.clear()

    def _handle(self, cmd: tuple[str, Any]) -> None:
        kind, arg = cmd
        if kind == "add":
            stream: _Stream = arg
            if stream.cancelled:
                return
            try:
                admitted = stream.admit(self.engine)
            except Exception as exc:  # admission refused (too long, pool full, bad import): fail this request only
                log.warning("request refused at admission: %s", exc)
                stream.push(RequestOutput([], True, "error", _describe(exc), stream.sent))
                return
            if isinstance(admitted, int):
                stream.rid = admitted
                self._live[stream.rid] = stream
            else:  # a Sequence that may already hold tokens (and may even be finished)
                stream.rid = int(admitted.rid)
                self._live[stream.rid] = stream
                self._emit(admitted)
        elif kind == "abort":
            stream = arg
            if stream.rid is not None and self._live.pop(stream.rid, None) is not None:
                self._abort(stream.rid)
        elif kind == "call":
            fn, fut = arg
            if fut.set_running_or_notify_cancel():
                try:
                    fut.set_result(fn(self.engine))
                except BaseException as exc:  # noqa: BLE001 - handed to the caller
                    fut.set_exception(exc)

    def _abort(self, rid: int) -> None:
        try:
            self.engine.abort(rid)
        except Exception:  # already finished or unknown: abort is best effort and idempotent
            log.debug("abort(%s) failed", rid, exc_info=True)

    def _step(self) -> None:
        t0 = time.perf_counter()
        try:
            updated = self.engine.step()
        except Exception as exc:
            self.failed_steps += 1
            self.last_error = _describe(exc)
            log.exception("engine step failed; failing %d in-flight request(s)", len(self._live))
            for rid, stream in list(self._live.items()):
                self._abort(rid)
                stream.push(RequestOutput([], True, "error", f"engine step failed: {self.last_error}", stream.sent))
            self._live.clear()
            return
        self.step_times.append(time.perf_counter() - t0)
        self.steps += 1
        for seq in updated or ():
            self._emit(seq)

    def _emit(self, seq: EngineSequence) -> None:
        stream = self._live.get(int(seq.rid))
        if stream is None:
            return
        finished = seq.is_finished
        if stream.coalesce and stream.sent and not finished:
            return  # its first tokens went out; the rest go with the finish
        out = list(seq.output_ids)
        new = out[stream.sent :]
        if new or finished:
            stream.sent = len(out)
            item = RequestOutput(token_ids=new, completion_tokens=len(out))
            lps = seq.output_logprobs
            if lps:
                item.logprobs = list(lps[stream.sent - len(new) : stream.sent])
            if finished:
                if stream.rid is not None:
                    self._live.pop(stream.rid, None)
                item.finished = True
                item.error = seq.error or None
                item.finish_reason = "error" if item.error else (seq.finish_reason or "stop")
                item.accept_lengths = list(seq.accepted_per_step)
                item.timings = seq_timings(seq)
                item.text = seq.text
                item.prefilled, seq.exported = seq.exported, None  # the caller owns the export from here
            self._outbox.setdefault(stream.loop, []).append((stream, item))

    def _flush(self) -> None:
        """Hand this step's deltas to their event loops, one call per loop (see `_outbox`)."""
        if not self._outbox:
            return
        box, self._outbox = self._outbox, {}
        for loop, items in box.items():
            try:
                loop.call_soon_threadsafe(_deliver, items)
            except RuntimeError:  # the event loop is closed: nobody is listening any more
                pass


def _deliver(items: list[tuple[_Stream, RequestOutput]]) -> None:
    """On the event loop: put each delta on its request's queue, in the engine's order."""
    for stream, item in items:
        stream.queue.put_nowait(item)


def seq_timings(seq: EngineSequence) -> dict[str, float]:
    """Server-side seconds of one request: queue/prefill until the first token, then decoding."""
    out: dict[str, float] = {}
    arrival, first, finish = seq.arrival_time, seq.first_token_time, seq.finish_time
    if first is not None:
        out["ttft_s"] = first - arrival
    if first is not None and finish is not None:
        out["decode_s"] = finish - first
    if finish is not None:
        out["engine_total_s"] = finish - arrival
    return out


def _describe(exc: BaseException) -> str:
    text = str(exc) or type(exc).__name__
    return text if len(text) < 2000 else text[:2000] + "..."
