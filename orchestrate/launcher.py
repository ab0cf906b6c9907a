"""Launcher: starts every process of a local deployment, waits until all are ready, supervises, stops them.

Contract (mini-sglang style: the launcher blocks on every worker's readiness before reporting ready):
- `Launcher(deployment, overrides=...)` plans one `specctl serve --role R --instance I` subprocess per
  engine instance (every prefill, every decode; or colocated) and, for a disaggregated deployment, the router
  in front of them (orchestrate/router.py: `python -m smg launch --pd-disaggregation ...`, or sglang-router
  with `roles.router.kind`), each logging to `<log_dir>/<name>.log` (names: `prefill`, `prefill.1`, ...).
  Every child's environment has HF_HUB_OFFLINE=1 and TRANSFORMERS_OFFLINE=1.
- `start()` first checks that every port the topology binds (each role's HTTP port, prefill's bootstrap
  port) is free, and raises `RuntimeFailure` (exit 3) naming the port, the role and the
  `--set roles.R.port=...` fix if not (another deployment, perhaps one still shutting down, holds it);
  then it spawns them (each in its own session, and with a parent-death signal on Linux, so an
  orphaned child never outlives the launcher). `wait_ready(timeout_s, on_status)` polls every role's
  `/health` until all answer 200 (decode answers 200 only once paired with every prefill) from the process
  it started (the body's `pid` must be the child's: a stranger on the port never counts as ready), then
  starts the router (so its start-up checks find healthy workers) and waits for its `/readiness`, calling
  `on_status(list[ProcessStatus])` on each poll; it raises `RuntimeFailure` naming the process, its
  exit code and the tail of its log if one exits, or which ones are not ready at the timeout.
- `check()` raises the same error if a process died after ready; `stop()` sends SIGTERM to all, waits
  `grace_s`, then SIGKILL; it is idempotent and safe from signal handlers' aftermath.
- The command of each engine instance comes from a planner, `planner(role, index) -> argv`, the one seam
  between the engines: `engine: builtin` runs `specctl serve`, `engine: sglang` runs the exported
  `python -m sglang.launch_server ...` (orchestrate/sglang_process.py; `start()` first checks that
  `sglang.python` imports SGLang, and writes the adaptive files under the log dir). Waiting, status,
  preflight, router and shutdown are the same code for both. A `/health` body that names a pid (specctl's)
  must name the started child's; SGLang's names none (the port was checked free before the start).
- Preflight: once every prefill and decode is healthy and before the router starts, `wait_ready` runs the
  live preflight (specctl/preflight) over every (prefill, decode) pair, each server also compared with what
  the deployment asked for its instance; any difference raises `PreflightRefused` (a RuntimeFailure, exit 3)
  with the itemized rows, and the router is never started. `preflight_reports` keeps the result.
- While a process does not answer yet, its status detail is the last line of its log (model loading
  takes minutes on a GPU); `ProcessStatus.started` is when it was spawned.
- `url` is the OpenAI endpoint (router, else colocated). Torch-free: health checks use preflight's bounded GET.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from specctl.errors import RuntimeFailure
from specctl.orchestrate.router import OFFLINE_ENV, http_url, role_instances, router_argv
from specctl.preflight.reader import get_json
from specctl.schemas.pd_agreement import show
from specctl.schemas.role_config import RoleConfig
from specctl.schemas.sglang.router import router_kind

if TYPE_CHECKING:
    from specctl.preflight.check import PreflightReport
    from specctl.schemas.deployment import Deployment

# (role, instance index) -> the argv of that engine process.
Planner = Callable[[str, int], list[str]]

_POLL_TIMEOUT_S = 1.0  # one /health or /readiness poll: a busy server answers on the next

# Start order matters: decode registers with prefill, the router health-checks both.
PD_ORDER = ("prefill", "decode", "router")
EXIT_MEANINGS = {
    0: "exited",
    1: "invalid deployment",
    2: "usage error or unreadable input",
    3: "launch, handshake or runtime failure",
    -9: "killed (SIGKILL)",
    -15: "terminated (SIGTERM)",
}


@dataclasses.dataclass
class ProcessStatus:
    role: str
    url: str
    pid: int | None = None
    state: str = "starting"  # starting | loading | pairing | waiting | ready | exited ...
    detail: str = ""
    ready: bool = False
    returncode: int | None = None
    log_path: str = ""
    since: float = dataclasses.field(default_factory=time.monotonic)
    started: float | None = None

    def elapsed(self, now: float | None = None) -> float:
        """Seconds since the process was spawned (0 before)."""
        return 0.0 if self.started is None else (now if now is not None else time.monotonic()) - self.started

    def to_json(self) -> dict[str, Any]:
        return {"role": self.role, "url": self.url, "pid": self.pid, "state": self.state, "detail": self.detail,
                "ready": self.ready, "returncode": self.returncode, "log": self.log_path,
                "elapsed_s": round(self.elapsed(), 2)}


@dataclasses.dataclass(frozen=True)
class PairPreflight:
    """The live preflight of one (prefill instance, decode instance) pair."""

    prefill: str
    decode: str
    report: PreflightReport

    def to_json(self) -> dict[str, Any]:
        return {"prefill_instance": self.prefill, "decode_instance": self.decode, **self.report.to_json()}


class PreflightRefused(RuntimeFailure):
    """A pair (or a server against the deployment) differs: the router must not route to it."""

    def __init__(self, pairs: Sequence[PairPreflight]) -> None:
        lines = []
        for pair in pairs:
            r = pair.report
            if r.ok:
                continue
            lines.append(f"{pair.prefill} {r.prefill.url} vs {pair.decode} {r.decode.url}:")
            lines += [f"  {d.field}: prefill={show(d.prefill)} decode={show(d.decode)} -- fix: {d.fix}"
                      + (f" ({d.detail})" if d.detail else "") for d in r.differences]
            lines += [f"  {d.field} ({d.role}): deployment asked {show(d.asked)}, the server runs "
                      f"{show(d.running)} -- fix: {d.fix}" for d in r.drifts]
        n = sum(len(p.report.differences) + len(p.report.drifts) for p in pairs)
        super().__init__(f"preflight refused the deployment: {n} difference(s); the router was not started\n"
                         + "\n".join(lines),
                         hint="fix every row and start again (specctl preflight -c DEPLOY checks a running pair)")
        self.pairs = tuple(pairs)


def instance_name(role: str, index: int) -> str:
    return role if index == 0 else f"{role}.{index}"


def split_name(name: str) -> tuple[str, int]:
    role, _, index = name.partition(".")
    return role, int(index or 0)


def roles_to_launch(roles: Sequence[str]) -> tuple[str, ...]:
    if "colocated" in roles and not {"prefill", "decode"} & set(roles):
        return ("colocated",)
    if {"prefill", "decode"} <= set(roles):
        return tuple(r for r in PD_ORDER if r in roles)
    raise RuntimeFailure(
        f"cannot launch roles {list(roles)}",
        hint="declare prefill + decode (+ router) for a disaggregated deployment, or colocated",
    )


def _pdeathsig() -> None:  # pragma: no cover - runs in the child between fork and exec
    os.setsid()
    if sys.platform.startswith("linux"):
        with contextlib.suppress(Exception):
            import ctypes

            ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG


def last_log_line(path: str, limit: int = 8192) -> str:
    """The last non-empty line of a log (read from its end: SGLang logs grow large), escapes stripped."""
    import re

    try:
        with open(path, "rb") as fh:
            fh.seek(0, os.SEEK_END)
            size = fh.tell()
            fh.seek(max(0, size - limit))
            raw = fh.read().decode("utf-8", errors="replace")
    except OSError:
        return ""
    for line in reversed(re.split(r"[\r\n]+", raw)):
        text = re.sub(r"\x1b\[[0-9;?]*[A-Za-z]", "", line).strip()
        if text:
            return text[:200]
    return ""


def log_tail(path: str, lines: int = 15) -> str:
    try:
        with open(path, encoding="utf-8", errors="replace") as fh:
            return "".join(fh.readlines()[-lines:]).rstrip()
    except OSError:
        return ""


class Launcher:
    def __init__(
        self,
        deployment: Deployment,
        *,
        overrides: Sequence[str] = (),
        log_dir: str | Path | None = None,
        env: dict[str, str] | None = None,
        python: str = sys.executable,
        planner: Planner | None = None,
        preflight_timeout_s: float = 60.0,
        preflight: bool = True,
    ) -> None:
        if not deployment.path:
            raise RuntimeFailure("the launcher needs a deployment loaded from a file (its processes re-read it)")
        self.deployment = deployment
        self.overrides = tuple(overrides)
        self.roles = roles_to_launch(deployment.roles)
        self.log_dir = Path(log_dir) if log_dir else Path(tempfile.mkdtemp(prefix="specctl-up-"))
        self.log_dir.mkdir(parents=True, exist_ok=True)
        self.env = {**os.environ, **(env or {}), **OFFLINE_ENV}
        self.python = python
        self.engine = deployment.engine
        self._custom_planner = planner is not None
        self.planner: Planner = planner or (self.sglang_command if self.engine == "sglang" else self.builtin_command)
        self.preflight_timeout_s = preflight_timeout_s
        self.preflight = preflight  # False only for stand-ins that serve no /server_info (supervision tests)
        self.preflight_reports: list[PairPreflight] | None = None
        self.procs: dict[str, subprocess.Popen[bytes]] = {}
        # One process per instance: prefill, prefill.1, ..., decode, ..., router.
        self.names: tuple[str, ...] = tuple(
            instance_name(r, i) for r in self.roles
            for i in range(1 if r == "router" else len(role_instances(deployment, r))))
        self.status = {n: ProcessStatus(n, http_url(self.role_config(n)), log_path=str(self.log_dir / f"{n}.log"))
                       for n in self.names}
        self._stopped = False

    def role_config(self, name: str) -> RoleConfig:
        role, index = split_name(name)
        if role == "router":
            return self.deployment.role(role)
        return role_instances(self.deployment, role)[index]

    @property
    def url(self) -> str:
        front = "router" if "router" in self.roles else self.roles[-1]
        return self.status[front].url

    def command(self, name: str) -> list[str]:
        role, index = split_name(name)
        if role == "router":
            return router_argv(self.deployment, python=self.python)
        return self.planner(role, index)

    def sglang_command(self, role: str, index: int) -> list[str]:
        """engine: sglang: the exported SGLang command of the instance (its adaptive file in the log dir)."""
        from specctl.orchestrate import sglang_process as sp

        argv, files = sp.role_command(self.deployment, role, index, python=sp.sglang_python(self.deployment),
                                      workdir=self.log_dir)
        sp.write_files(files)
        return argv

    def builtin_command(self, role: str, index: int) -> list[str]:
        """engine: builtin: `specctl serve --role R -c FILE [--instance I] [--set ...]`."""
        cmd = [self.python, "-m", "specctl.cli", "serve", "--role", role, "-c", str(self.deployment.path)]
        if index:
            cmd += ["--instance", str(index)]
        for o in self.overrides:
            cmd += ["--set", o]
        return cmd

    def role_env(self, role: str) -> dict[str, str]:
        """The child's environment. CPU threads are split between the engine processes unless the user
        set OMP_NUM_THREADS: on a small CPU machine two engines with one OpenMP team per core each
        oversubscribe the cores, and measured prefill forwards then run several times slower."""
        env = dict(self.env)
        engines = [n for n in self.names if split_name(n)[0] != "router"]
        if "OMP_NUM_THREADS" not in env and role in engines:
            env["OMP_NUM_THREADS"] = str(max(1, (os.cpu_count() or 1) // len(engines)))
        return env

    def planned_ports(self) -> list[tuple[str, str, str, int]]:
        """(role, what, host, port) for every port the topology will bind, with the key that sets it."""
        out = []
        for name in self.names:
            cfg = self.role_config(name)
            role, index = split_name(name)
            key = role if len(role_instances(self.deployment, role)) == 1 or role == "router" else f"{role}.{index}"
            host = cfg.host or "127.0.0.1"
            if cfg.port is not None:
                out.append((key, "port", host, cfg.port))
            if role == "prefill" and cfg.bootstrap_port is not None:
                out.append((key, "bootstrap_port", host, cfg.bootstrap_port))
        return out

    def check_ports(self) -> None:
        """Raise RuntimeFailure (exit 3) if any port the topology binds is taken or planned twice."""
        seen: dict[int, str] = {}
        for role, what, host, port in self.planned_ports():
            key = f"roles.{role}.{what}"
            if port in seen:
                raise RuntimeFailure(f"{key}={port} is also {seen[port]}: two processes cannot bind one port",
                                     hint=f"choose another port: --set {key}=<port>")
            seen[port] = key
            if port == 0:
                continue
            problem = port_problem(host, port)
            if problem is not None:
                label = "bootstrap port" if what == "bootstrap_port" else "HTTP port"
                raise RuntimeFailure(
                    f"port {port} on {host} ({role} {label}, {key}) is not free: {problem}; another deployment "
                    "(perhaps one still shutting down) may hold it, and it would be mistaken for this one",
                    hint=f"stop the other deployment, or choose another port: --set {key}=<port>")

    def start(self) -> None:
        """Check the ports and start every engine process; the router starts once they are ready."""
        self.check_ports()
        if "router" in self.roles:
            from specctl.orchestrate.router import check_installed

            check_installed(self.python, router_kind(self.deployment))
        if self.engine == "sglang" and not self._custom_planner:
            from specctl.orchestrate import sglang_process as sp

            sp.check_sglang(sp.sglang_python(self.deployment))
        elif not self._custom_planner and self.python == sys.executable:
            from specctl.engine.install import require_engine

            require_engine("engine: builtin")
        for name in self.names:
            if name != "router":
                self._spawn(name)
        if "router" in self.status:
            self.status["router"].detail = "starts once prefill and decode are ready and pass the preflight"

    def _spawn(self, name: str) -> None:
        st = self.status[name]
        log = open(st.log_path, "ab")  # noqa: SIM115 - handed to the child; closed in stop()
        proc = subprocess.Popen(self.command(name), stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                env=self.role_env(name), preexec_fn=_pdeathsig, close_fds=True)  # noqa: PLW1509
        log.close()  # the child holds its own descriptor
        self.procs[name] = proc
        st.pid = proc.pid
        st.since = st.started = time.monotonic()

    def poll(self) -> list[ProcessStatus]:
        for role, st in self.status.items():
            proc = self.procs.get(role)
            if proc is not None and proc.poll() is not None:
                st.returncode = proc.returncode
                st.state, st.ready = "exited", False
                st.detail = self.exit_meaning(role, proc.returncode)
                continue
            if role == "router":
                self._poll_router(st, proc)
                continue
            body, code = get_json(st.url + "/health", _POLL_TIMEOUT_S)
            if code is None:
                # Not answering: not up yet, or too busy (loading a model holds the CPU); keep the last
                # state a process reported rather than flapping back to "starting".
                st.ready = False
                if st.state == "starting":
                    st.detail = last_log_line(st.log_path) or "waiting for its HTTP port"
                continue
            pid = body.get("pid")
            if proc is not None and pid is not None and pid != proc.pid:
                # Someone else answers on this port (another deployment, possibly shutting down): never
                # report it ready; our child is still starting (it will fail to bind and exit, named).
                st.ready = False
                st.state, st.detail = "foreign", f"port answered by pid {pid}, not the started pid {proc.pid}"
                continue
            new_state = "ready" if code == 200 else str(body.get("status") or code)
            if new_state != st.state:
                st.since = time.monotonic()
            st.state, st.ready = new_state, code == 200
            st.detail = str(body.get("detail") or "")
        engines_ready = all(s.ready for n, s in self.status.items() if n != "router")
        if engines_ready and not self._stopped and self.preflight and self.preflight_reports is None \
                and "prefill" in self.roles:
            self.run_preflight()  # raises PreflightRefused: the router is never started
        if "router" in self.status and "router" not in self.procs and not self._stopped and engines_ready:
            self._spawn("router")
        return list(self.status.values())

    def run_preflight(self) -> list[PairPreflight]:
        """The live preflight of every (prefill, decode) pair, each server against its instance's roles.
        Raises PreflightRefused on any difference; RuntimeFailure when a server cannot be read."""
        from specctl.preflight.check import run_preflight

        prefills, decodes = role_instances(self.deployment, "prefill"), role_instances(self.deployment, "decode")
        pairs: list[PairPreflight] = []
        for i, pre in enumerate(prefills):
            for j, dec in enumerate(decodes):
                # bootstrap_port None: read prefill's bootstrap /route when it speaks SGLang's (an SGLang
                # prefill reports it); specctl's prefill pairs through its own verified handshake.
                report = run_preflight(http_url(pre), http_url(dec), deployment_roles={"prefill": pre, "decode": dec},
                                       timeout_s=self.preflight_timeout_s)
                pairs.append(PairPreflight(instance_name("prefill", i), instance_name("decode", j), report))
        self.preflight_reports = pairs
        if not all(p.report.ok for p in pairs):
            raise PreflightRefused(pairs)
        return pairs

    def _poll_router(self, st: ProcessStatus, proc: subprocess.Popen[bytes] | None) -> None:
        # A router names no pid; the port was checked free before anything started, so the answer on it
        # is the started router's. /readiness is 200 once it holds a healthy prefill and decode.
        if proc is None:
            st.state, st.ready = "waiting", False
            return
        body, code = get_json(st.url + "/readiness", _POLL_TIMEOUT_S)
        ready = code == 200
        new_state = "ready" if ready else ("starting" if code is None else str(body.get("status") or code))
        if new_state != st.state:
            st.since = time.monotonic()
        st.state, st.ready = new_state, ready
        st.detail = "" if ready else ("waiting for its HTTP port" if code is None else json.dumps(body)[:200])

    def failure(self) -> RuntimeFailure | None:
        """The first process that exited, as an error naming it and why (log tail included)."""
        for role in self.names:
            proc = self.procs.get(role)
            if proc is not None and proc.poll() is not None:
                st = self.status[role]
                why = self.exit_meaning(role, proc.returncode)
                tail = log_tail(st.log_path)
                msg = f"{role} (pid {proc.pid}) exited with code {proc.returncode}: {why}"
                if tail:
                    msg += f"\n--- last lines of {st.log_path} ---\n{tail}"
                return RuntimeFailure(msg, hint=f"full log: {st.log_path}")
        return None

    def exit_meaning(self, name: str, code: int) -> str:
        """specctl's exit codes mean something only for `specctl serve`; SGLang and the router have their own."""
        if code < 0:
            return EXIT_MEANINGS.get(code, f"killed by signal {-code}")
        ours = self.engine == "builtin" and not self._custom_planner and split_name(name)[0] != "router"
        return EXIT_MEANINGS.get(code, f"exit code {code}") if ours else f"exit code {code}"

    def check(self) -> None:
        err = self.failure()
        if err is not None:
            raise err

    def wait_ready(self, timeout_s: float = 300.0, on_status: Callable[[list[ProcessStatus]], None] | None = None,
                   poll_s: float = 0.25) -> None:
        deadline = time.monotonic() + timeout_s
        while True:
            statuses = self.poll()
            if on_status is not None:
                on_status(statuses)
            self.check()
            if all(s.ready for s in statuses):
                return
            if time.monotonic() > deadline:
                waiting = ", ".join(f"{s.role} ({s.state}: {s.detail})" for s in statuses if not s.ready)
                raise RuntimeFailure(f"not ready after {timeout_s:g}s: {waiting}",
                                     hint=f"logs in {self.log_dir}")
            time.sleep(poll_s)

    def stop(self, grace_s: float = 10.0) -> dict[str, int | None]:
        """SIGTERM every live process (router first, prefill last), then SIGKILL stragglers."""
        if self._stopped:
            return {r: p.returncode for r, p in self.procs.items()}
        self._stopped = True
        for role in reversed(self.names):
            proc = self.procs.get(role)
            if proc is not None and proc.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    proc.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + grace_s
        for proc in self.procs.values():
            left = max(0.0, deadline - time.monotonic())
            try:
                proc.wait(left)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    proc.kill()
                proc.wait(5)
        return {r: p.returncode for r, p in self.procs.items()}

    def __enter__(self) -> Launcher:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def port_problem(host: str, port: int) -> str | None:
    """Why (host, port) cannot be bound now, or None when it is free. SO_REUSEADDR as the servers use
    it, so a port with only TIME_WAIT connections left counts as free and a listening one does not."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((host, port))
        except OSError as exc:
            return exc.strerror or str(exc)
    return None
