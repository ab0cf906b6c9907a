"""Progress display while a bench runs, on stderr (diagnostics; results go to stdout).

On a terminal: a Rich live bar per sweep point with done/total, errors, in-flight count and the
running median TTFT, refreshed by Rich's own thread a few times a second (the request path only
bumps counters). Elsewhere: one plain line per sweep point when it starts and ends.
"""

from __future__ import annotations

import statistics
import time

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, SpinnerColumn, TextColumn, TimeElapsedColumn

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


class LiveProgress:
    def __init__(self, console: Console) -> None:
        self._progress = Progress(SpinnerColumn(), TextColumn("{task.description}"), BarColumn(),
                                  MofNCompleteColumn(), TextColumn("{task.fields[status]}"), TimeElapsedColumn(),
                                  console=console, transient=False, refresh_per_second=4)
        self._task: int | None = None
        self._errors = 0
        self._ttfts: list[float] = []
        self._p50 = ""
        self._progress.start()

    def start_point(self, index: int, count: int, point: LoadPoint, total: int | None) -> None:
        self._errors = 0
        self._ttfts = []
        self._p50 = ""
        self._task = self._progress.add_task(f"[{index + 1}/{count}] {point.label()}", total=total, status="")

    def on_result(self, result: RequestResult) -> None:
        if self._task is None:
            return
        if result.ok and result.ttft is not None:
            self._ttfts.append(result.ttft)
        else:
            self._errors += 1
        if self._ttfts and len(self._ttfts) % 16 == 1:
            self._p50 = f"  p50 ttft {statistics.median(self._ttfts[-256:]) * 1000:.0f} ms"
        self._progress.update(self._task, advance=1, status=f"errors {self._errors}{self._p50}")

    def end_point(self) -> None:
        if self._task is not None:
            self._progress.stop_task(self._task)

    def close(self) -> None:
        self._progress.stop()


def make_progress(console: Console, *, enabled: bool = True) -> PlainProgress | LiveProgress | None:
    if not enabled:
        return None
    if console.is_terminal:
        return LiveProgress(console)
    return PlainProgress(console)
