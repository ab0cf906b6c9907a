"""Verify traces: one JSON line per verify batch, written by the engine and read by `specctl adaptive`.

The format (JSON Lines; one object per line, blank lines skipped, unknown keys ignored):

    {"batch_size": 4, "accepted": [2, 3, 0, 1]}                                  # the original format
    {"time": 1733050000.12, "batch_size": 4, "steps": 3, "accepted": [2, 3, 0, 1],
     "drafted": [3, 3, 3, 2], "rids": [0, 5, 6, 9], "draft_s": 0.0012, "verify_s": 0.0031, "sampled": 1,
     "run": "3f2a9c1e07b4", "trace_steps": 7}

`batch_size` and `accepted` (accepted draft tokens per request) are required: they are what the
adaptive policy consumes, so `adaptive simulate` replays either shape. The engine adds `time` (Unix
seconds when the verify finished), `steps` (the steps the batch ran with), `drafted` (drafts each
request actually proposed: fewer than `steps` when the drafter had nothing or max_tokens capped it),
`rids` (the engine's request ids, so one request's verifies can be followed through the trace),
`draft_s` and `verify_s` (wall seconds drafting, and verifying + accepting), `sampled` (how many of the
batch's requests sample, temperature > 0: their drafts and verify take the costlier rejection-sampling
path, which `adaptive tune` prices with the cost model's sampled table), `run` (one id per engine: every
engine starts its adaptive policy fresh, so `adaptive tune` replays each run with a policy of its own; a
file several engines appended to, or several benchmark runs, holds several runs). `trace_steps` is set when
the engine ran with `--trace-steps K` (drafting K every step whatever the policy says): such a trace
is counterfactual-complete, because a verify that drafted K and accepted a would have accepted
min(a, k) with any k <= K (greedy acceptance is a prefix test, so a shorter draft is a prefix of the
longer one and passes the same tests).

Steps 0 batches are recorded with `accepted` all zeros and `drafted` all zeros (exactly what the
engine feeds the policy: they count as batches but teach it nothing).

`TraceWriter` appends whole lines with one `write` on an O_APPEND file, so several engine processes
may share a file. Torch-free.
"""

from __future__ import annotations

import json
import math
import os
import time
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from specctl.errors import UsageError

MAX_TRACE_LINE = 1 << 20  # one verify record; a longer line is not one


@dataclass(frozen=True)
class TraceRecord:
    """One verify batch. Only `batch_size` and `accepted` are required; the rest is None in old traces."""

    line: int
    batch_size: int
    accepted: tuple[int, ...]
    steps: int | None = None
    drafted: tuple[int, ...] | None = None
    time: float | None = None
    draft_s: float | None = None
    verify_s: float | None = None
    trace_steps: int | None = None
    rids: tuple[int, ...] | None = None
    sampled: int | None = None  # requests of the batch that sample (None: unknown, an older trace)
    run: str | None = None  # the engine that wrote it (None: an older trace, one run)

    @property
    def drafted_per_request(self) -> tuple[int, ...] | None:
        """Drafts each request proposed: `drafted`, else `steps` for every request, else unknown."""
        if self.drafted is not None:
            return self.drafted
        if self.steps is not None:
            return (self.steps,) * len(self.accepted)
        return None

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"batch_size": self.batch_size, "accepted": list(self.accepted)}
        for key in ("time", "steps", "draft_s", "verify_s", "sampled", "trace_steps"):
            value = getattr(self, key)
            if value is not None:
                out[key] = value
        if self.drafted is not None:
            out["drafted"] = list(self.drafted)
        if self.rids is not None:
            out["rids"] = list(self.rids)
        if self.run is not None:
            out["run"] = self.run
        return out


def _bad_line(path: str, line: int, what: str) -> UsageError:
    return UsageError(
        f"{path}:{line}: {what}",
        hint='each trace line is one JSON object such as {"batch_size": 4, "accepted": [2, 3, 0, 1]}',
    )


def _shown(v: object) -> str:
    return str(v) if isinstance(v, float) and not math.isfinite(v) else json.dumps(v)


def _int_list(obj: dict[str, Any], key: str, name: str, lineno: int) -> tuple[int, ...]:
    vals = obj.get(key)
    if not isinstance(vals, list):
        raise _bad_line(name, lineno, f"{key} must be a list of non-negative integers, got {_shown(vals)}")
    for i, a in enumerate(vals):
        if not isinstance(a, int) or isinstance(a, bool) or a < 0:
            raise _bad_line(name, lineno, f"{key}[{i}] must be a non-negative integer, got {_shown(a)}")
    return tuple(vals)


def _opt_int(obj: dict[str, Any], key: str, name: str, lineno: int) -> int | None:
    v = obj.get(key)
    if v is None:
        return None
    if not isinstance(v, int) or isinstance(v, bool) or v < 0:
        raise _bad_line(name, lineno, f"{key} must be a non-negative integer, got {_shown(v)}")
    return v


def _opt_float(obj: dict[str, Any], key: str, name: str, lineno: int) -> float | None:
    v = obj.get(key)
    if v is None:
        return None
    if not isinstance(v, (int, float)) or isinstance(v, bool) or not math.isfinite(v) or v < 0:
        raise _bad_line(name, lineno, f"{key} must be a non-negative number, got {_shown(v)}")
    return float(v)


def parse_record(obj: object, name: str, lineno: int) -> TraceRecord:
    """One decoded JSON line -> TraceRecord; UsageError naming the file, line and field otherwise."""
    if not isinstance(obj, dict):
        raise _bad_line(name, lineno, f"expected a JSON object, got {type(obj).__name__}")
    bs = obj.get("batch_size")
    if not isinstance(bs, int) or isinstance(bs, bool) or bs < 1:
        raise _bad_line(name, lineno, f"batch_size must be a positive integer, got {_shown(bs)}")
    acc = _int_list(obj, "accepted", name, lineno)
    drafted = _int_list(obj, "drafted", name, lineno) if obj.get("drafted") is not None else None
    steps = _opt_int(obj, "steps", name, lineno)
    trace_steps = _opt_int(obj, "trace_steps", name, lineno)
    if drafted is not None:
        if len(drafted) != len(acc):
            raise _bad_line(name, lineno, f"drafted has {len(drafted)} entries but accepted has {len(acc)}")
        for i, (a, d) in enumerate(zip(acc, drafted, strict=True)):
            if a > d:
                raise _bad_line(name, lineno, f"accepted[{i}] = {a} exceeds drafted[{i}] = {d}")
    rids = _int_list(obj, "rids", name, lineno) if obj.get("rids") is not None else None
    if rids is not None and len(rids) != len(acc):
        raise _bad_line(name, lineno, f"rids has {len(rids)} entries but accepted has {len(acc)}")
    if steps is not None and any(a > steps for a in acc):
        raise _bad_line(name, lineno, f"an accepted count exceeds steps = {steps}")
    sampled = _opt_int(obj, "sampled", name, lineno)
    if sampled is not None and sampled > len(acc):
        raise _bad_line(name, lineno, f"sampled = {sampled} exceeds the batch's {len(acc)} requests")
    return TraceRecord(
        line=lineno, batch_size=bs, accepted=acc, steps=steps, drafted=drafted,
        time=_opt_float(obj, "time", name, lineno), draft_s=_opt_float(obj, "draft_s", name, lineno),
        verify_s=_opt_float(obj, "verify_s", name, lineno), trace_steps=trace_steps, rids=rids,
        sampled=sampled, run=_opt_run(obj, name, lineno),
    )


def _opt_run(obj: dict[str, Any], name: str, lineno: int) -> str | None:
    v = obj.get("run")
    if v is None:
        return None
    if not isinstance(v, str) or not v or len(v) > 64:
        raise _bad_line(name, lineno, f"run must be a short non-empty string, got {_shown(v)}")
    return v


def read_trace(path: str | Path) -> list[TraceRecord]:
    """Parse a JSONL trace; UsageError naming the file and line for anything malformed."""
    name = str(path)
    try:
        with open(path, "rb") as fh:
            raw_lines = fh.read().split(b"\n")
    except IsADirectoryError:
        raise UsageError(f"{name}: is a directory, not a trace file") from None
    except OSError as exc:
        raise UsageError(f"{name}: cannot read trace: {exc.strerror or exc}") from None
    records: list[TraceRecord] = []
    for lineno, raw in enumerate(raw_lines, start=1):
        if len(raw) > MAX_TRACE_LINE:
            raise _bad_line(name, lineno, f"line longer than {MAX_TRACE_LINE} bytes")
        try:
            text = raw.decode("utf-8").strip()
        except UnicodeDecodeError:
            raise _bad_line(name, lineno, "not UTF-8 text") from None
        if not text:
            continue
        try:
            obj = json.loads(text, parse_constant=lambda c: float("nan"))
        except (ValueError, RecursionError) as exc:
            raise _bad_line(name, lineno, f"not valid JSON ({str(exc).split(':')[0]})") from None
        records.append(parse_record(obj, name, lineno))
    return records


class TraceWriter:
    """Appends one line per verify batch to a file (opened once, O_APPEND, line-buffered by hand)."""

    def __init__(self, path: str | Path, *, trace_steps: int | None = None) -> None:
        self.path = str(path)
        self.trace_steps = trace_steps
        try:
            self._fd: int | None = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        except OSError as exc:
            from specctl.errors import RuntimeFailure

            raise RuntimeFailure(f"cannot open verify trace {self.path}: {exc.strerror or exc}",
                                 hint="pass a writable file to --trace-out") from None
        self.records = 0
        self.run = uuid.uuid4().hex[:12]  # this engine's run: its policy started fresh

    def record(
        self,
        *,
        batch_size: int,
        steps: int,
        accepted: Sequence[int],
        drafted: Sequence[int],
        rids: Sequence[int],
        draft_s: float,
        verify_s: float,
        sampled: int = 0,
    ) -> None:
        if self._fd is None:
            return
        obj: dict[str, Any] = {
            "time": round(time.time(), 6),
            "batch_size": batch_size,
            "steps": steps,
            "accepted": list(accepted),
            "drafted": list(drafted),
            "rids": list(rids),
            "draft_s": round(draft_s, 7),
            "verify_s": round(verify_s, 7),
            "sampled": sampled,
            "run": self.run,
        }
        if self.trace_steps is not None:
            obj["trace_steps"] = self.trace_steps
        os.write(self._fd, (json.dumps(obj, separators=(",", ":")) + "\n").encode())
        self.records += 1

    def close(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None


TRACE_OUT_ENV = "SPECCTL_TRACE_OUT"
TRACE_STEPS_ENV = "SPECCTL_TRACE_STEPS"
