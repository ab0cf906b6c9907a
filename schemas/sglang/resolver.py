"""SGLang's own start-up verdicts, obtained by running SGLang in child processes (`resolve_child.py`).

`resolve(cases, python=...)` answers one `Verdict` per `ResolveCase`, in order: did
`prepare_server_args(argv)` + `ServerArgs.resolve_once()` of the SGLang installed for `python` accept the
command on the declared GPU, and if not, where SGLang raised and what it said; if so, every `ServerArgs`
field as SGLang resolved it. One child per GPU (SGLang caches the device), each importing SGLang once and
forking per case. This module imports neither torch nor sglang.

Failures are answers, never hangs or tracebacks: an interpreter that cannot import SGLang raises
`ResolverUnavailable` (with SGLang's own error); a case that crashes or outlives `case_timeout` is a
verdict of type `Crash` / `Timeout`; a child that stops answering ends its remaining cases the same way.
"""

from __future__ import annotations

import importlib.util
import json
import os
import select
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

from specctl.schemas.sglang.startup import GPUS

CHILD = Path(__file__).resolve().with_name("resolve_child.py")
MAX_LINE = 8 << 20  # one answer line: every ServerArgs field of one command


class ResolverUnavailable(Exception):
    """The interpreter cannot run SGLang's resolution (no SGLang, an import error, a hung import)."""


@dataclass(frozen=True)
class ResolveCase:
    argv: tuple[str, ...]
    env: Mapping[str, str] = field(default_factory=dict)
    gpu: str = "H100"


@dataclass(frozen=True)
class RaiseSite:
    """Where SGLang refused: exception type, message, `sglang/...py:LINE` and the enclosing function."""

    type: str
    message: str
    site: str = ""
    function: str = ""

    @property
    def file(self) -> str:
        return self.site.rsplit(":", 1)[0]


@dataclass(frozen=True)
class Verdict:
    ok: bool
    error: RaiseSite | None = None
    resolved: Mapping[str, Any] = field(default_factory=dict)
    seconds: float = 0.0

    @property
    def infrastructure(self) -> bool:
        """The resolution itself failed (crash, timeout, protocol), not a check of SGLang's."""
        return self.error is not None and self.error.type in ("Crash", "Timeout", "ProtocolError")


@dataclass(frozen=True)
class Release:
    sglang: str
    python: str


def has_sglang(python: str | None = None) -> bool:
    """Whether `python` (default: this interpreter) has an importable `sglang` (without importing it)."""
    if python is None or os.path.realpath(python) == os.path.realpath(sys.executable):
        return importlib.util.find_spec("sglang") is not None
    try:
        probe = "import importlib.util, sys; sys.exit(importlib.util.find_spec('sglang') is None)"
        proc = subprocess.run([python, "-c", probe], capture_output=True, timeout=30, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return False
    return proc.returncode == 0


def _verdict(obj: Mapping[str, Any]) -> Verdict:
    err = obj.get("error")
    error = None
    if isinstance(err, Mapping):
        error = RaiseSite(str(err.get("type", "")), str(err.get("message", "")), str(err.get("site", "")),
                          str(err.get("function", "")))
    resolved = obj.get("resolved")
    return Verdict(ok=bool(obj.get("ok")), error=error,
                   resolved=dict(resolved) if isinstance(resolved, Mapping) else {},
                   seconds=float(obj.get("seconds") or 0.0))


def _failed(kind: str, message: str) -> Verdict:
    return Verdict(ok=False, error=RaiseSite(kind, message))


class _Child:
    """One resolve_child process for one GPU."""

    def __init__(self, python: str, gpu: str, cwd: str | None, start_timeout: float) -> None:
        env = dict(os.environ)
        env.update({"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "PYTHONUNBUFFERED": "1"})
        self.stderr: IO[bytes] = tempfile.TemporaryFile()
        try:
            self.proc = subprocess.Popen([python, str(CHILD), "--gpu", gpu], stdin=subprocess.PIPE,
                                         stdout=subprocess.PIPE, stderr=self.stderr, cwd=cwd, env=env)
        except OSError as exc:
            self.stderr.close()
            raise ResolverUnavailable(f"cannot start {python}: {exc}") from None
        self.buf = b""
        self.tail: str | None = None  # set once the child is stopped
        ready = self.read(start_timeout)
        if ready is None:
            tail = self.stop()
            raise ResolverUnavailable(f"SGLang did not load within {start_timeout:g} s with {python}{tail}")
        if not ready.get("ready"):
            err = ready.get("error") or {}
            tail = self.stop()
            raise ResolverUnavailable(f"SGLang cannot be loaded with {python}: "
                                      f"{err.get('type', 'Error')}: {err.get('message', '')}{tail}")
        self.release = Release(str(ready.get("sglang", "unknown")), str(ready.get("python", python)))

    def read(self, timeout: float) -> dict[str, Any] | None:
        """One JSON line, or None on timeout / end of output / a malformed or oversized line."""
        assert self.proc.stdout is not None
        fd = self.proc.stdout.fileno()
        deadline = time.monotonic() + timeout
        while b"\n" not in self.buf:
            left = deadline - time.monotonic()
            if left <= 0 or len(self.buf) > MAX_LINE:
                return None
            ready, _, _ = select.select([fd], [], [], left)
            if not ready:
                continue
            chunk = os.read(fd, 1 << 16)
            if not chunk:
                return None
            self.buf += chunk
        line, self.buf = self.buf.split(b"\n", 1)
        try:
            obj = json.loads(line)
        except ValueError:
            return None
        return obj if isinstance(obj, dict) else None

    def ask(self, idx: int, case: ResolveCase, case_timeout: float) -> Verdict:
        assert self.proc.stdin is not None
        if self.tail is not None:
            return _failed("Crash", f"the SGLang resolution process had ended{self.tail}")
        msg = {"id": idx, "argv": list(case.argv), "env": dict(case.env), "timeout": case_timeout}
        try:
            self.proc.stdin.write((json.dumps(msg) + "\n").encode())
            self.proc.stdin.flush()
        except (OSError, ValueError):
            return _failed("Crash", f"the SGLang resolution process has ended{self.stop()}")
        answer = self.read(case_timeout + 30.0)  # the child times the case itself; this bounds the child
        if answer is None or answer.get("id") != idx:
            return _failed("Crash", f"the SGLang resolution process stopped answering{self.stop()}")
        return _verdict(answer)

    def stop(self) -> str:
        """End the child; answer the tail of its stderr (for messages)."""
        if self.tail is not None:
            return self.tail
        for pipe in (self.proc.stdin, self.proc.stdout):
            if pipe is not None:
                try:
                    pipe.close()
                except OSError:
                    pass
        try:
            self.proc.wait(timeout=5)  # the child ends at the end of its input
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        self.stderr.seek(0, os.SEEK_END)
        size = self.stderr.tell()
        self.stderr.seek(max(0, size - 1500))
        tail = self.stderr.read().decode("utf-8", "replace").strip().splitlines()[-6:]
        self.stderr.close()
        self.tail = (": " + " | ".join(tail)) if tail else ""
        return self.tail


def resolve(cases: Sequence[ResolveCase], *, python: str | None = None, cwd: str | None = None,
            case_timeout: float = 60.0, start_timeout: float = 300.0) -> tuple[Release, list[Verdict]]:
    """SGLang's verdict on each case, in order; raises ResolverUnavailable when SGLang cannot be loaded."""
    py = python or sys.executable
    for case in cases:
        if case.gpu not in GPUS:
            raise ValueError(f"gpu {case.gpu!r}: one of {', '.join(GPUS)}")
    groups: dict[str, list[int]] = {}
    for i, case in enumerate(cases):
        groups.setdefault(case.gpu, []).append(i)
    verdicts: list[Verdict | None] = [None] * len(cases)
    releases: list[Release] = []
    problems: list[ResolverUnavailable] = []

    def run(gpu: str, idxs: list[int]) -> None:
        try:
            child = _Child(py, gpu, cwd, start_timeout)
        except ResolverUnavailable as exc:
            problems.append(exc)
            return
        releases.append(child.release)
        for i in idxs:
            verdicts[i] = child.ask(i, cases[i], case_timeout)
        child.stop()

    threads = [threading.Thread(target=run, args=(gpu, idxs), daemon=True) for gpu, idxs in groups.items()]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if problems:
        raise problems[0]
    release = releases[0] if releases else Release("unknown", py)
    return release, [v if v is not None else _failed("Crash", "no answer") for v in verdicts]
