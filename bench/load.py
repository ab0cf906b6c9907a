"""Load generation for one sweep point: open loop (a paced arrival schedule) or closed loop.

Open loop (finite `request_rate`): arrival i is *scheduled* at `start + offsets[i]` (see `arrivals`)
and launched by the `Pacer` at that instant whether or not earlier requests finished; with a
`max_concurrency` cap it then waits for a slot, and that wait counts as latency because latency is
measured from the scheduled time. Closed loop (infinite rate with a cap): `max_concurrency` workers
each send the next prompt as soon as their previous request finishes; a request's scheduled time is
its send time. Infinite rate without a cap sends everything at once.

A run stops after its prompts (`num_prompts`, or `duration_s` worth of arrivals, prompts cycled) and
then waits for the requests in flight (each bounded by the request timeout).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import gc
import math
import time
from collections.abc import Callable, Iterator, Sequence

from specctl.bench.arrivals import arrival_offsets, count_for_duration
from specctl.bench.config import LoadPoint
from specctl.bench.pacer import Pacer
from specctl.bench.request import RequestResult, RequestSender
from specctl.bench.workload import Prompt
from specctl.errors import UsageError

# Lead time between creating the schedule and its first arrival, so the pacer thread is running.
_LEAD_S = 0.02


@dataclasses.dataclass
class LoadResult:
    """Every request of one sweep point, in launch order, with the run's clock anchors."""

    point: LoadPoint
    results: list[RequestResult]
    start: float  # perf_counter of the schedule's origin
    wall_start: float  # time.time() at `start` (to align server-side timelines)
    mono_start: float  # time.monotonic() at `start` (servers on this host stamp with it)
    end: float  # perf_counter when the last request finished

    @property
    def duration(self) -> float:
        return max(self.end - self.start, 1e-9)


OnResult = Callable[[RequestResult], None]


@contextlib.contextmanager
def quiet_gc() -> Iterator[None]:
    """No cyclic-GC pauses while a run is measured; the collector's state is restored afterwards.

    Why: a generation-1/2 collection walks every tracked object (aiohttp, numpy, rich, the results
    so far) and stops the loop thread for milliseconds -- longer than the whole latency budget of a
    fast server -- landing on whichever requests are in flight (measured against an instant stub at
    500 req/s: gen-1 pauses up to ~11 ms, gen-2 ~20 ms). So everything alive before the run is
    collected once (before the schedule's origin is set) and frozen, and the collector is off during
    the run. The request path makes no reference cycles (a run of successful requests leaves zero
    unreachable objects), so memory stays bounded by reference counting; the few cycles a failure's
    traceback makes wait for the next collection after the run.
    """
    was_enabled = gc.isenabled()
    gc.collect()
    gc.freeze()
    gc.disable()
    try:
        yield
    finally:
        gc.unfreeze()
        if was_enabled:
            gc.enable()


async def run_load(sender: RequestSender, prompts: Sequence[Prompt], bodies: Sequence[bytes], point: LoadPoint, *,
                   duration_s: float | None = None, burstiness: float = 1.0, seed: int = 0,
                   on_result: OnResult | None = None) -> LoadResult:
    """Run one sweep point and return its results (failures are inside the results, never raised)."""
    if duration_s is not None and not point.open_loop and point.max_concurrency is None:
        raise UsageError("--duration needs a finite --request-rate or a --max-concurrency",
                         hint="with an infinite rate and no cap every request is sent at once")
    with quiet_gc():
        if point.open_loop or point.max_concurrency is None:
            return await _open_loop(sender, prompts, bodies, point, duration_s, burstiness, seed, on_result)
        return await _closed_loop(sender, prompts, bodies, point, duration_s, on_result)


def _result(index: int, prompt: Prompt, scheduled: float) -> RequestResult:
    return RequestResult(index=index, prompt_len=prompt.prompt_len, output_len=prompt.output_len, scheduled=scheduled)


async def _open_loop(sender: RequestSender, prompts: Sequence[Prompt], bodies: Sequence[bytes], point: LoadPoint,
                     duration_s: float | None, burstiness: float, seed: int, on_result: OnResult | None) -> LoadResult:
    loop = asyncio.get_running_loop()
    n = len(prompts) if duration_s is None else count_for_duration(duration_s, point.request_rate)
    offsets = arrival_offsets(n, point.request_rate, burstiness=burstiness, seed=seed)
    results: list[RequestResult] = []
    tasks: list[asyncio.Task[None]] = []
    slots = asyncio.Semaphore(point.max_concurrency) if point.max_concurrency else None

    async def one(result: RequestResult, body: bytes) -> None:
        if slots is None:
            await sender.send(result, body)
        else:
            async with slots:
                await sender.send(result, body)
        if on_result is not None:
            on_result(result)

    def fire(index: int, deadline: float) -> None:
        k = index % len(prompts)
        result = _result(index, prompts[k], deadline)
        results.append(result)
        tasks.append(loop.create_task(one(result, bodies[k])))

    start = time.perf_counter() + _LEAD_S
    wall_start = time.time() + _LEAD_S
    mono_start = time.monotonic() + _LEAD_S
    if not math.isfinite(point.request_rate):
        # Everything at once: no pacing to do.
        while time.perf_counter() < start:
            await asyncio.sleep(start - time.perf_counter())
        for i in range(n):
            fire(i, start)
    else:
        pacer = Pacer(loop, offsets, start, fire)
        pacer.start()
        try:
            await pacer.done
        finally:
            pacer.stop()
            pacer.join(1.0)
    try:
        if tasks:
            await asyncio.gather(*tasks)
    finally:
        for task in tasks:
            task.cancel()
    return LoadResult(point, results, start, wall_start, mono_start, _last_end(results, start))


async def _closed_loop(sender: RequestSender, prompts: Sequence[Prompt], bodies: Sequence[bytes], point: LoadPoint,
                       duration_s: float | None, on_result: OnResult | None) -> LoadResult:
    results: list[RequestResult] = []
    start = time.perf_counter()
    wall_start = time.time()
    mono_start = time.monotonic()
    stop_at = start + duration_s if duration_s is not None else math.inf
    total = len(prompts) if duration_s is None else math.inf
    counter = iter(range(10**12))

    async def worker() -> None:
        while True:
            index = next(counter)
            now = time.perf_counter()
            if index >= total or now >= stop_at:
                return
            k = index % len(prompts)
            result = _result(index, prompts[k], now)
            results.append(result)
            await sender.send(result, bodies[k])
            if on_result is not None:
                on_result(result)

    assert point.max_concurrency is not None
    workers = [asyncio.ensure_future(worker()) for _ in range(point.max_concurrency)]
    try:
        await asyncio.gather(*workers)
    finally:
        for w in workers:
            w.cancel()
    results.sort(key=lambda r: r.index)
    return LoadResult(point, results, start, wall_start, mono_start, _last_end(results, start))


def _last_end(results: Sequence[RequestResult], start: float) -> float:
    ends = [r.end for r in results if r.end is not None]
    return max(ends) if ends else time.perf_counter()
