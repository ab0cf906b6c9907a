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
from collections import deque
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from specctl.errors import RuntimeFailure, UsageError

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
    # Built from request lines (`expand_requests`), not recorded: a lockstep batch under the order assumption,
    # which may hold fewer requests than `batch_size` (the group's tail): `adaptive tune` prices such a batch
    # at its share, len(accepted) / batch_size, of a full one.
    from_requests: bool = False

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


def read_requests(path: str | Path) -> list[RequestRecord]:
    """The request lines of a trace file, as written (`read_trace` returns them expanded)."""
    out: list[RequestRecord] = []
    with open(path, "rb") as fh:
        for lineno, raw in enumerate(fh, start=1):
            if HISTOGRAM_KEY.encode() not in raw or len(raw) > MAX_TRACE_LINE:
                continue
            try:
                obj = json.loads(raw)
            except ValueError:
                continue
            if isinstance(obj, dict) and HISTOGRAM_KEY in obj:
                out.append(parse_request(obj, str(path), lineno))
    return out


def read_trace(path: str | Path) -> list[TraceRecord]:
    """Parse a JSONL trace; UsageError naming the file and line for anything malformed. Request lines
    (`RequestRecord`) come back expanded into verify records (`expand_requests`), after the file's own."""
    name = str(path)
    try:
        with open(path, "rb") as fh:
            raw_lines = fh.read().split(b"\n")
    except IsADirectoryError:
        raise UsageError(f"{name}: is a directory, not a trace file") from None
    except OSError as exc:
        raise UsageError(f"{name}: cannot read trace: {exc.strerror or exc}") from None
    records: list[TraceRecord] = []
    requests: list[RequestRecord] = []
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
        if isinstance(obj, dict) and HISTOGRAM_KEY in obj:
            requests.append(parse_request(obj, name, lineno))
        else:
            records.append(parse_record(obj, name, lineno))
    return records + expand_requests(requests)


# ---- request lines: what SGLang reports per finished request -------------------------------------------

HISTOGRAM_KEY = "spec_correct_drafts_histogram"


@dataclass(frozen=True)
class RequestRecord:
    """One finished request's acceptance, as SGLang reports it: a request line of a trace.

    `histogram[a]` is how many of its `verify_ct` verifies accepted a drafts (SGLang's
    `spec_correct_drafts_histogram`), `steps` the launch-time draft length K it ran at (every verify drafted at
    most K), `batch_size` the concurrency it decoded at (observed by the client or from the server's request
    times: an estimate), `accepted` its verifies' accepted drafts in order where the engine gave them (specctl's
    `spec_accept_lengths`, a DSPARK dump), `adaptive` whether the server ran an adaptive policy (then verifies
    drafted fewer than K at times, and a count below K says less), `source` where it was read."""

    line: int
    request: str
    steps: int
    verify_ct: int
    histogram: tuple[int, ...]
    batch_size: int = 1
    accepted: tuple[int, ...] | None = None
    run: str | None = None
    adaptive: bool | None = None
    source: str | None = None
    decode_s: float | None = None  # wall seconds from its first token to its last (the serving time it saw)
    ttft_s: float | None = None  # wall seconds from its arrival to its first token (prefill, transfer, queueing)

    @property
    def tokens(self) -> int:
        """Tokens its verifies emitted (accepted drafts plus each verify's own token)."""
        return sum(n * (a + 1) for a, n in enumerate(self.histogram))

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"request": self.request, "steps": self.steps, "spec_verify_ct": self.verify_ct,
                               HISTOGRAM_KEY: list(self.histogram), "batch_size": self.batch_size}
        if self.accepted is not None:
            out["accepted"] = list(self.accepted)
        for key in ("run", "adaptive", "source", "decode_s", "ttft_s"):
            if getattr(self, key) is not None:
                out[key] = getattr(self, key)
        return out

    def without_order(self) -> RequestRecord:
        """The histogram alone, as SGLang's per-request statistics give it."""
        return RequestRecord(self.line, self.request, self.steps, self.verify_ct, self.histogram, self.batch_size,
                             None, self.run, self.adaptive, self.source, self.decode_s, self.ttft_s)


def histogram_of(accepted: Iterable[int]) -> tuple[int, ...]:
    hist: list[int] = []
    for a in accepted:
        if a >= len(hist):
            hist.extend([0] * (a + 1 - len(hist)))
        hist[a] += 1
    return tuple(hist)


def parse_request(obj: dict[str, Any], name: str, lineno: int) -> RequestRecord:
    """One decoded request line -> RequestRecord; UsageError naming the file, line and field otherwise."""
    req = obj.get("request")
    if not isinstance(req, (str, int)) or isinstance(req, bool) or str(req) == "" or len(str(req)) > 256:
        raise _bad_line(name, lineno, f"request must be a request id (a short string), got {_shown(req)}")
    hist = _int_list(obj, HISTOGRAM_KEY, name, lineno)
    steps = _opt_int(obj, "steps", name, lineno)
    if steps is None or steps < 1:
        raise _bad_line(name, lineno, f"steps (the launch-time draft length) must be a positive integer, got "
                                      f"{_shown(obj.get('steps'))}")
    verify_ct = _opt_int(obj, "spec_verify_ct", name, lineno)
    if verify_ct is None or verify_ct != sum(hist):
        raise _bad_line(name, lineno, f"spec_verify_ct must equal the histogram's sum {sum(hist)}, got "
                                      f"{_shown(obj.get('spec_verify_ct'))}")
    top = max((a for a, n in enumerate(hist) if n), default=0)
    if top > steps:
        raise _bad_line(name, lineno, f"a verify accepted {top} drafts, more than steps = {steps}")
    bs = obj.get("batch_size", 1)
    if not isinstance(bs, int) or isinstance(bs, bool) or bs < 1:
        raise _bad_line(name, lineno, f"batch_size must be a positive integer, got {_shown(bs)}")
    accepted = _int_list(obj, "accepted", name, lineno) if obj.get("accepted") is not None else None
    if accepted is not None and histogram_of(accepted) != tuple(hist[:top + 1]):
        raise _bad_line(name, lineno, f"accepted does not match {HISTOGRAM_KEY}")
    adaptive = obj.get("adaptive")
    if adaptive is not None and not isinstance(adaptive, bool):
        raise _bad_line(name, lineno, f"adaptive must be true or false, got {_shown(adaptive)}")
    source = obj.get("source")
    return RequestRecord(lineno, str(req), steps, verify_ct, tuple(hist[:top + 1]), bs, accepted,
                         _opt_run(obj, name, lineno), adaptive, source if isinstance(source, str) else None,
                         _opt_float(obj, "decode_s", name, lineno), _opt_float(obj, "ttft_s", name, lineno))


def assumed_order(histogram: Sequence[int]) -> list[int]:
    """The order assumed for a request whose verifies are known only as a histogram: each accepted count's
    verifies spread evenly over the request's life (the j-th of h verifies that accepted a sits at
    (j + 0.5) / h), i.e. no trend within a request and no runs of alike verifies beyond what the counts force.
    Deterministic, so every config replayed meets the same sequence."""
    items = sorted(((j + 0.5) / h, a) for a, h in enumerate(histogram) for j in range(h))
    return [a for _, a in items]


def expand_requests(requests: Sequence[RequestRecord]) -> list[TraceRecord]:
    """Request lines -> verify records, under the order assumption: within one run, the requests of one
    observed concurrency B decode B at a time in lockstep (first-seen order, the next joining as one
    finishes), each advancing one verify per batch through its `accepted` order, or `assumed_order` of its
    histogram, every verify drafting the request's `steps`. Each request gets a rid of its own (numbered in
    file order), so `adaptive tune` replays them position by position as it does an engine trace.

    What the order changes: nothing in a verify-for-verify replay at fixed steps (min(a, k) summed over a
    request's verifies is order-free, so `tune` on a trace without rids predicts fixed steps exactly). The
    positional replay `tune` runs on rids walks the same traced verifies at fixed steps, but a verify that
    accepted all K bounds what follows it only from below (`tune._censored` estimates the rest from what
    follows), and a request's last verifies draft only what max_tokens leaves: both depend on the order,
    as does the adaptive policy, which decides on the order it sees.
    """
    groups: dict[tuple[str | None, int], list[tuple[int, RequestRecord]]] = {}
    for rid, r in enumerate(requests):
        if r.verify_ct:
            groups.setdefault((r.run, r.batch_size), []).append((rid, r))
    out: list[TraceRecord] = []
    for (run, width), reqs in groups.items():
        pending = deque(reqs)
        active: list[tuple[int, RequestRecord, deque[int]]] = []
        while pending or active:
            while pending and len(active) < width:
                rid, r = pending.popleft()
                order = r.accepted if r.accepted is not None else assumed_order(r.histogram)
                active.append((rid, r, deque(order)))
            acc = tuple(seq.popleft() for _, _, seq in active)
            out.append(TraceRecord(line=active[0][1].line, batch_size=width, accepted=acc,
                                   steps=max(r.steps for _, r, _ in active),
                                   drafted=tuple(r.steps for _, r, _ in active),
                                   trace_steps=min(r.steps for _, r, _ in active),
                                   rids=tuple(rid for rid, _, _ in active),
                                   # a run of its own even unnamed: its rids are not an engine's
                                   run=run if run is not None else "requests", from_requests=True))
            active = [(rid, r, seq) for rid, r, seq in active if seq]
    return out


def request_form(records: Sequence[TraceRecord], *, keep_order: bool = False) -> list[RequestRecord]:
    """An engine trace (with rids) in the form SGLang reports it: one request line per (run, request), its
    histogram (and with `keep_order` its verifies in order), the trace's depth as `steps` and the mean batch
    size it verified in, rounded, as `batch_size`. What `adaptive tune` would see of the same run from SGLang."""
    seen: dict[tuple[str | None, int], list[tuple[int, int]]] = {}
    depth: dict[str | None, int] = {}
    span: dict[tuple[str | None, int], list[float]] = {}  # first verify's start, last verify's end
    for rec in records:
        if rec.time is not None and rec.rids is not None:
            start = rec.time - (rec.draft_s or 0.0) - (rec.verify_s or 0.0)
            for rid in rec.rids:
                span.setdefault((rec.run, rid), [start, rec.time])[1] = rec.time
        if rec.rids is None:
            raise UsageError("the trace has no rids: its verifies cannot be followed per request",
                             hint="record it with `specctl serve --trace-out FILE` (or `bench -c ... --trace-out`)")
        k = rec.trace_steps or rec.steps or max(rec.accepted, default=0)
        depth[rec.run] = max(depth.get(rec.run, 0), k)
        for rid, a in zip(rec.rids, rec.accepted, strict=True):
            seen.setdefault((rec.run, rid), []).append((a, rec.batch_size))
    out = []
    for i, ((run, rid), rows) in enumerate(seen.items(), start=1):
        acc = [a for a, _ in rows]
        width = max(1, round(sum(b for _, b in rows) / len(rows)))
        t = span.get((run, rid))
        out.append(RequestRecord(i, str(rid), max(1, depth[run]), len(acc), histogram_of(acc), width,
                                 tuple(acc) if keep_order else None, run, None, "engine trace",
                                 round(t[1] - t[0], 6) if t is not None else None))
    return out


class TraceWriter:
    """Appends one line per verify batch to a file (opened once, O_APPEND, line-buffered by hand)."""

    def __init__(self, path: str | Path, *, trace_steps: int | None = None) -> None:
        self.path = str(path)
        self.trace_steps = trace_steps
        try:
            self._fd: int | None = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        except OSError as exc:
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
