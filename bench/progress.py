"""Progress display while a bench runs, on stderr (diagnostics; results go to stdout).

On a terminal: a Rich live bar per sweep point with done/total, errors and the running median
TTFT, refreshed by Rich's own thread a few times a second (the request path only bumps counters;
the render copies them into the display). Elsewhere: one plain line per sweep point when it starts
and ends.
"""

from __future__ import annotations

import dataclasses
import statistics
import time
from collections.abc import Callable, Iterable
from typing import Any

from rich.console import Console, RenderableType
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    ProgressColumn,
    SpinnerColumn,
    TaskID,
    TextColumn,
    TimeElapsedColumn,
)

from specctl.bench.config import LoadPoint
from specctl.bench.request import RequestResult


class PlainProgress:
    def __init__(self, console: Console) -> None:
        self._console = console
        self._done = self._errors = 0
        self._t0 = 0.0
        self._label = ""

    def start_point(self, index: int, count: int, point: LoadPoint, total: int | None) -> None:
        self._done = self._errors = 0
        self._t0 = time.perf_counter()
        self._label = f"[{index + 1}/{count}] {point.label()}"
        self._console.print(f"bench {self._label}: {total if total is not None else 'until --duration'} requests",
                            markup=False, highlight=False)

    def on_result(self, result: RequestResult) -> None:
        self._done += 1
        self._errors += 0 if result.ok else 1

    def end_point(self) -> None:
        self._console.print(f"bench {self._label}: {self._done} done, {self._errors} errors in "
                            f"{time.perf_counter() - self._t0:.1f} s", markup=False, highlight=False)

    def close(self) -> None:
        pass


@dataclasses.dataclass
class _PointCounts:
    task: TaskID
    done: int = 0
    errors: int = 0
    ttfts: list[float] = dataclasses.field(default_factory=list)


class _SyncedProgress(Progress):
    """A Rich `Progress` that pulls its numbers from `sync` whenever it renders (on Rich's thread)."""

    def __init__(self, *columns: ProgressColumn, sync: Callable[[], None], **kwargs: Any) -> None:
        self._sync = sync  # first: the base class may render while it initialises
        super().__init__(*columns, **kwargs)

    def get_renderables(self) -> Iterable[RenderableType]:
        self._sync()
        yield from super().get_renderables()


class LiveProgress:
    """Why the split: at hundreds of requests a second, a Rich `update` (a lock, task bookkeeping) and
    the running median per result would sit on the event loop thread, between the arrivals it paces.
    So `on_result` (loop thread) only bumps counters; the render (Rich's refresh thread, 4x a second)
    copies them into the task, with the median over the latest TTFTs."""

    def __init__(self, console: Console) -> None:
        self._point: _PointCounts | None = None
        self._progress = _SyncedProgress(SpinnerColumn(), TextColumn("{task.description}"), BarColumn(),
                                         MofNCompleteColumn(), TextColumn("{task.fields[status]}"),
                                         TimeElapsedColumn(), sync=self._sync, console=console, transient=False,
                                         refresh_per_second=4)
        self._progress.start()

    def start_point(self, index: int, count: int, point: LoadPoint, total: int | None) -> None:
        task = self._progress.add_task(f"[{index + 1}/{count}] {point.label()}", total=total, status="")
        # One object per point, swapped whole: a render racing the swap sees one point's numbers.
        self._point = _PointCounts(task)

    def on_result(self, result: RequestResult) -> None:
        counts = self._point
        if counts is None:
            return
        counts.done += 1
        if result.ok and result.ttft is not None:
            counts.ttfts.append(result.ttft)
            if len(counts.ttfts) > 4096:
                del counts.ttfts[:-256]  # only the latest 256 are shown
        else:
            counts.errors += 1

    def _sync(self) -> None:
        counts = self._point
        if counts is None:
            return
        recent = counts.ttfts[-256:]  # a copy: the loop thread may append meanwhile
        p50 = f"  p50 ttft {statistics.median(recent) * 1000:.0f} ms" if recent else ""
        self._progress.update(counts.task, completed=counts.done, status=f"errors {counts.errors}{p50}")

    def end_point(self) -> None:
        if self._point is not None:
            self._sync()
            self._progress.stop_task(self._point.task)

    def close(self) -> None:
        self._progress.stop()


def make_progress(console: Console, *, enabled: bool = True) -> PlainProgress | LiveProgress | None:
    if not enabled:
        return None
    if console.is_terminal:
        return LiveProgress(console)
    return PlainProgress(console)
