"""Pacer: fires callbacks on an asyncio loop at absolute `time.perf_counter()` times.

Why a thread: asyncio's timers wake through epoll, whose timeout has millisecond granularity (the
selector rounds it up), so an `asyncio.sleep` to a deadline lands 0-1 ms late -- as much as the whole
latency budget of a fast server. A dedicated thread waits on `threading.Event.wait` (a timed futex,
~0.1 ms precise) and hands each arrival to the loop with `call_soon_threadsafe`, which wakes the
loop's epoll immediately. Every deadline is absolute (start + offset), so lateness never accumulates:
the achieved rate equals the scheduled one however long the run (a sleep-per-gap client drifts below
its target by the sum of its overheads).
"""

from __future__ import annotations

import asyncio
import sys
import threading
import time
from collections.abc import Callable, Sequence

_SWITCH_INTERVAL_S = 0.0002


class Pacer:
    """Calls `fire(index, deadline)` on `loop` at `start + offsets[index]` for every index, in order."""

    def __init__(self, loop: asyncio.AbstractEventLoop, offsets: Sequence[float], start: float,
                 fire: Callable[[int, float], None]) -> None:
        self._loop = loop
        self._offsets = offsets
        self._start = start
        self._fire = fire
        self._stop = threading.Event()
        self._switch_interval: float | None = None
        self.done: asyncio.Future[int] = loop.create_future()
        self._thread = threading.Thread(target=self._run, name="specctl-bench-pacer", daemon=True)

    def start(self) -> None:
        # A thread that wakes wants the GIL; while the loop thread runs Python code CPython hands it
        # over only after the switch interval (5 ms by default) -- a late arrival of up to 5 ms. A
        # short interval while pacing keeps the handoff well under a millisecond; restored by stop().
        self._switch_interval = sys.getswitchinterval()
        sys.setswitchinterval(min(self._switch_interval, _SWITCH_INTERVAL_S))
        self._thread.start()

    def stop(self) -> None:
        """Fire nothing more (the `done` future resolves with the number fired)."""
        self._stop.set()
        if self._switch_interval is not None:
            sys.setswitchinterval(self._switch_interval)
            self._switch_interval = None

    def join(self, timeout: float | None = None) -> None:
        self._thread.join(timeout)

    def _run(self) -> None:
        fired = 0
        try:
            for index, offset in enumerate(self._offsets):
                deadline = self._start + offset
                delay = deadline - time.perf_counter()
                if delay > 0 and self._stop.wait(delay):
                    break
                if self._stop.is_set():
                    break
                self._loop.call_soon_threadsafe(self._fire, index, deadline)
                fired += 1
        except RuntimeError:
            # The loop closed under us (interrupted run): nothing left to fire into.
            return
        try:
            self._loop.call_soon_threadsafe(self._resolve, fired)
        except RuntimeError:
            pass

    def _resolve(self, fired: int) -> None:
        if not self.done.done():
            self.done.set_result(fired)
