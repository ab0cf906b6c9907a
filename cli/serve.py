"""`specctl serve --role R -c DEPLOY` (one process) and `specctl up -c DEPLOY` (the whole local topology).

Thin wrappers: load + validate the deployment (with `--set` overrides), then hand off to
`specctl.engine.serve.roles.serve_role` (one engine process), `specctl.orchestrate.router.run_router` (the
router) or `specctl.orchestrate.launcher.Launcher` (all of them).
Exit codes: 0 stopped cleanly (Ctrl-C / SIGTERM); 1 invalid deployment; 2 usage error or unreadable
file; 3 launch, handshake or runtime failure (a refused decode, a process that died).
torch is imported only inside the serving process, never by `specctl --help`.
"""

from __future__ import annotations

import contextlib
import enum
import json
import signal
import sys
import time
from typing import TYPE_CHECKING, Annotated, Optional

import typer

from specctl.cli.common import OutputFormat, fail, handle_errors, stderr_console
from specctl.cli.main import app
from specctl.cli.options import ConfigOption, SetOption
from specctl.errors import RuntimeFailure, SpecctlError, UsageError

if TYPE_CHECKING:
    from types import FrameType

    from rich.console import Console
    from rich.live import Live

    from specctl.orchestrate.launcher import ProcessStatus
    from specctl.schemas.deployment import Deployment

UP_TIMEOUT_S = 300.0
SGLANG_UP_TIMEOUT_S = 1200.0


class Role(str, enum.Enum):
    prefill = "prefill"
    decode = "decode"
    router = "router"
    colocated = "colocated"


def _load(config: str, overrides: tuple[str, ...]) -> Deployment:
    from specctl.schemas.validator import load_deployment

    return load_deployment(config, overrides=overrides)


_SERVE_EPILOG = (
    "With engine: sglang, a prefill, decode or colocated role execs the exported SGLang server command "
    "(python -m sglang.launch_server ..., run by sglang.python or this interpreter, HF_HUB_OFFLINE=1); exit 3"
    " with the fix when that Python cannot import SGLang. --print-command shows the command instead."
)


@app.command(epilog=_SERVE_EPILOG)
def serve(
    role: Annotated[Role, typer.Option("--role", help="Which process of the deployment to run.")],
    config: ConfigOption,
    set_: SetOption = None,
    trace_out: Annotated[str | None, typer.Option(
        "--trace-out", metavar="FILE", help="Append one JSON line per verify batch (time, batch size, steps, "
        "accepted and drafted per request, draft and verify seconds) to FILE: the trace `specctl adaptive "
        "simulate|tune` read.")] = None,
    trace_steps: Annotated[int | None, typer.Option(
        "--trace-steps", min=1, metavar="K", help="With --trace-out: draft K tokens every step whatever the "
        "adaptive policy says, so the trace answers what any k <= K would have accepted.")] = None,
    export_metrics_dir: Annotated[str | None, typer.Option(
        "--export-metrics-to-file-dir", metavar="DIR", help="Append one JSON line per finished request "
        "(SGLang's meta_info: spec_verify_ct, spec_correct_drafts_histogram, ...) to "
        "DIR/sglang-request-metrics-YYYYmmdd_HH.log, as SGLang's --export-metrics-to-file does: what "
        "`specctl adaptive trace --from-sglang-metrics` reads.")] = None,
    instance: Annotated[int, typer.Option("--instance", help="Which instance of a role that lists several "
                                          "(roles.prefill / roles.decode as a list), from 0.")] = 0,
    print_command: Annotated[bool, typer.Option(
        "--print-command", help="With engine: sglang, print the SGLang command this would exec (JSON: argv, "
        "files, env) and exit 0 instead of running it.")] = False,
    fault_plan: Annotated[str | None, typer.Option(
        "--fault-plan", hidden=True, help="Tests only: a JSON FaultPlan (engine/serve/faults.py).")] = None,
) -> None:
    """Run one process of a deployment until Ctrl-C / SIGTERM: a prefill or decode engine (decode pairs with
    every prefill through the verifying handshake before it is healthy), a colocated engine, or the router
    (smg, or sglang-router with roles.router.kind, in PD mode in front of every prefill and decode instance)."""
    with handle_errors():
        set_trace_env(trace_out, trace_steps)
        if export_metrics_dir is not None:
            import os
            from pathlib import Path

            from specctl.engine.serve.spec_stats import EXPORT_DIR_ENV

            os.environ[EXPORT_DIR_ENV] = str(Path(export_metrics_dir).resolve())
        deployment = _load(config, tuple(set_ or ()))
        if deployment.engine == "sglang" and role is not Role.router:
            _serve_sglang(deployment, role.value, instance, print_command=print_command)
            return
        if print_command:
            raise UsageError("--print-command prints the SGLang command of engine: sglang",
                             hint="add --set engine=sglang (or engine: sglang in the deployment)")
        from specctl.engine.serve.faults import FaultPlan
        from specctl.engine.serve.roles import serve_role
        from specctl.orchestrate.router import run_router

        if role is not Role.router:
            from specctl.engine.install import require_engine

            require_engine(f"specctl serve --role {role.value}")
        faults = FaultPlan.from_file(fault_plan) if fault_plan is not None else None
        try:
            if role is Role.router:
                code = run_router(deployment)
            else:
                code = serve_role(deployment, role.value, instance, faults=faults)
        except SpecctlError as exc:
            fail(exc)
            code = exc.exit_code
        # Everything is closed by now; skip interpreter finalization, which tears down torch for
        # seconds on a busy machine and would delay `specctl up`'s clean stop.
        _fast_exit(code)


def _serve_sglang(deployment: Deployment, role: str, instance: int, *, print_command: bool) -> None:
    """engine: sglang: exec SGLang's server for the role (or print the command)."""
    from specctl.orchestrate import sglang_process as sp
    from specctl.orchestrate.router import OFFLINE_ENV

    if print_command:
        argv, files = sp.role_command(deployment, role, instance, python=sp.sglang_python(deployment),
                                      workdir=sp.default_workdir(deployment))
        typer.echo(json.dumps({"argv": argv, "files": files, "env": dict(OFFLINE_ENV)}, indent=2))
        return
    sp.exec_role(deployment, role, instance)


def set_trace_env(trace_out: str | None, trace_steps: int | None) -> None:
    """Hand --trace-out/--trace-steps to the engine config (and to processes launched from here)."""
    import os
    from pathlib import Path

    from specctl.adaptive.trace import TRACE_OUT_ENV, TRACE_STEPS_ENV

    if trace_steps is not None and trace_out is None:
        raise UsageError("--trace-steps needs --trace-out FILE", hint="add --trace-out verify_trace.jsonl")
    if trace_out is not None:
        os.environ[TRACE_OUT_ENV] = str(Path(trace_out).resolve())  # children may run elsewhere
    if trace_steps is not None:
        os.environ[TRACE_STEPS_ENV] = str(trace_steps)


def _fast_exit(code: int) -> None:
    import logging
    import os

    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


_UP_EPILOG = (
    "Every prefill and decode starts first (engine: builtin runs specctl's engine; engine: sglang the "
    "exported SGLang servers, with sglang.python or this interpreter), with a live status per process on "
    "stderr (state, elapsed time, last log line). Once all answer /health, the live preflight (the same as "
    "`specctl preflight`) checks every (prefill, decode) pair and each server against the deployment: any "
    "difference prints its rows, stops everything and exits 3 before the router (smg; "
    "roles.router.kind: sglang-router for SGLang's previous one) starts. --format json "
    "reports each pair's preflight."
)


@app.command(epilog=_UP_EPILOG)
def up(
    config: ConfigOption,
    set_: SetOption = None,
    timeout: Annotated[Optional[float], typer.Option(  # noqa: UP045 - Typer reads annotations at runtime
        "--timeout", metavar="S", show_default=False,
        help="Seconds to wait until every process is ready (default 300; 1200 with engine: sglang, whose GPU "
             "model loading takes minutes).")] = None,
    log_dir: Annotated[str | None, typer.Option("--log-dir", help="Where each process logs (default: a temp dir).")]
    = None,
    fmt: Annotated[OutputFormat, typer.Option("--format", help="Output format of the ready/stop reports.")]
    = OutputFormat.text,
) -> None:
    """Start the whole local topology, wait until every process is paired and ready, print the URL, and
    supervise until Ctrl-C / SIGTERM (then stop all). If one process dies, say which and why, stop the rest."""
    with handle_errors():
        deployment = _load(config, tuple(set_ or ()))
        if timeout is None:
            timeout = SGLANG_UP_TIMEOUT_S if deployment.engine == "sglang" else UP_TIMEOUT_S
        code = run_up(deployment, overrides=tuple(set_ or ()), timeout_s=timeout, log_dir=log_dir, fmt=fmt)
        raise typer.Exit(code)


class _Stop(Exception):
    pass


def run_up(deployment: Deployment, *, overrides: tuple[str, ...], timeout_s: float, log_dir: str | None,
           fmt: OutputFormat = OutputFormat.text) -> int:
    from specctl.orchestrate.launcher import Launcher

    err = stderr_console()
    launcher = Launcher(deployment, overrides=overrides, log_dir=log_dir)

    def on_signal(signum: int, frame: FrameType | None) -> None:
        raise _Stop(signal.Signals(signum).name)

    old = {s: signal.signal(s, on_signal) for s in (signal.SIGINT, signal.SIGTERM)}
    display = _StatusDisplay(err)
    try:
        err.print(f"starting {', '.join(launcher.roles)} of {deployment.name!r} (logs: {launcher.log_dir})")
        if "router" in launcher.roles:
            from specctl.orchestrate.router import slow_client_warning
            from specctl.schemas.sglang.router import router_kind

            warning = slow_client_warning(router_kind(deployment))
            if warning:
                err.print(f"[yellow]warning:[/yellow] {warning}")
        launcher.start()
        t0 = time.monotonic()
        try:
            with display:
                launcher.wait_ready(timeout_s, on_status=display.update)
        finally:
            display.close()
        pairs = launcher.preflight_reports or []
        if pairs:
            prints = sorted({f for p in pairs for f in p.report.fingerprints().values()})
            err.print(f"preflight: {len(pairs)} prefill/decode pair(s) agree on every compared field "
                      f"(fingerprints {', '.join(prints)})", highlight=False)
        ready = {"ok": True, "url": launcher.url, "deployment": deployment.name, "engine": launcher.engine,
                 "ready_after_s": round(time.monotonic() - t0, 2),
                 "processes": [s.to_json() for s in launcher.status.values()],
                 "preflight": [p.to_json() for p in pairs], "log_dir": str(launcher.log_dir)}
        if fmt is OutputFormat.json:
            typer.echo(json.dumps(ready))
        else:
            typer.echo(f"ready: {launcher.url}  (OpenAI API: {launcher.url}/v1; {ready['ready_after_s']}s)")
            typer.echo(f'try: curl -N {launcher.url}/v1/completions -H "Content-Type: application/json" '
                       """-d '{"model": "default", "prompt": "def fib(n):", "max_tokens": 64, "stream": true}'""")
        sys.stdout.flush()
        while True:  # supervise
            launcher.check()
            time.sleep(0.5)
    except _Stop as stop:
        err.print(f"{stop}: stopping {', '.join(launcher.roles)}")
        codes = launcher.stop()
        if fmt is OutputFormat.json:
            typer.echo(json.dumps({"ok": True, "stopped": codes}))
        return 0
    except RuntimeFailure as exc:
        launcher.stop()
        if fmt is OutputFormat.json:
            typer.echo(json.dumps({"ok": False, "error": str(exc), "hint": exc.hint,
                                   "processes": [s.to_json() for s in launcher.status.values()],
                                   "preflight": [p.to_json() for p in launcher.preflight_reports or []]},
                                  default=str))
        raise
    finally:
        launcher.stop()
        for s, h in old.items():
            signal.signal(s, h)


def rich_escape(text: str) -> str:
    from rich.markup import escape

    return escape(text)


class _StatusDisplay:
    """A live table on a terminal; one line per change otherwise (logs, CI)."""

    HEARTBEAT_S = 15.0  # plain mode: repeat a not-ready process's line this often (long model loads)

    def __init__(self, console: Console) -> None:
        self.console = console
        self.live: Live | None = None
        self._last: dict[str, tuple[str, str]] = {}
        self._printed: dict[str, float] = {}

    def __enter__(self) -> _StatusDisplay:
        if self.console.is_terminal:
            from rich.live import Live

            self.live = Live(console=self.console, refresh_per_second=8, transient=False)
            self.live.__enter__()
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        if self.live is not None:
            with contextlib.suppress(Exception):
                self.live.__exit__(None, None, None)
            self.live = None

    def update(self, statuses: list[ProcessStatus]) -> None:
        if self.live is not None:
            from rich.table import Table

            table = Table(title="specctl up", expand=False)
            for col in ("role", "pid", "state", "elapsed", "detail (or last log line)", "url"):
                table.add_column(col)
            now = time.monotonic()
            for s in statuses:
                style = "green" if s.ready else ("red" if s.returncode is not None else "yellow")
                table.add_row(s.role, str(s.pid or ""), f"[{style}]{s.state}[/]", f"{s.elapsed(now):5.1f}s",
                              rich_escape(s.detail[:80]), s.url)
            self.live.update(table)
            return
        now = time.monotonic()
        for s in statuses:
            key = (s.state, s.detail)
            stale = not s.ready and s.pid is not None and now - self._printed.get(s.role, now) >= self.HEARTBEAT_S
            if self._last.get(s.role) != key or stale:
                self._last[s.role] = key
                self._printed[s.role] = now
                self.console.print(f"  {s.role:<9} {s.state:<9} {s.elapsed(now):6.1f}s  {s.detail}", highlight=False,
                                   soft_wrap=True, markup=False)
