"""`specctl preflight --prefill URL --decode URL`: compare two running servers before any traffic.

Thin wrapper over `specctl.preflight.check.run_preflight`. Exit codes: 0 the pair matches (and
matches the deployment, with -c); 2 usage error or unreadable deployment; 3 a difference, or a
server that is down, answers non-JSON, or whose bootstrap is still not registered at --timeout.
Torch-free: it runs anywhere that can reach both servers.
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Annotated, Optional

import typer

from specctl.cli.common import OutputFormat, handle_errors, stdout_console
from specctl.cli.main import app
from specctl.cli.options import SetOption
from specctl.errors import RuntimeFailure, SpecctlError, UsageError

if TYPE_CHECKING:
    from specctl.preflight.check import PreflightReport

_EPILOG = (
    "Reads each server's /server_info and /model_info, and prefill's bootstrap "
    "GET /route?prefill_dp_rank=-1&... (503 until prefill has registered: retried until --timeout). "
    "Compares model and architecture, dtype, page size, KV-cache dtype and layout, TP/DP/PP/attention-TP, "
    "decode allocation policy, transfer backend, speculative algorithm, draft model, steps and adaptive "
    "settings, hybrid-memory flags, state_types and version. Works against SGLang servers and specctl's own.\n\n"
    "Exit codes: 0 the pair matches (and matches the deployment, with -c); 2 usage error or unreadable "
    "deployment; 3 any difference, or a server that is down, answers non-JSON, or whose bootstrap is still "
    "not registered at --timeout.\n\n"
    "Examples: specctl preflight --prefill http://10.0.0.1:30001 --bootstrap-port 8998 "
    "--decode http://10.0.0.2:30002 -c deploy.yaml; specctl preflight -c deploy.yaml (URLs from its roles)"
)


@app.command(epilog=_EPILOG)
def preflight(
    prefill: Annotated[Optional[str], typer.Option(  # noqa: UP045 - Typer reads annotations at runtime
        "--prefill", metavar="URL", help="The prefill server's HTTP URL (default: the deployment's prefill role).",
        show_default=False)] = None,
    decode: Annotated[Optional[str], typer.Option(  # noqa: UP045
        "--decode", metavar="URL", help="The decode server's HTTP URL (default: the deployment's decode role).",
        show_default=False)] = None,
    bootstrap_port: Annotated[Optional[int], typer.Option(  # noqa: UP045 - Typer reads annotations at runtime
        "--bootstrap-port", min=1, max=65535, metavar="N",
        help="Prefill's --disaggregation-bootstrap-port (default: what an SGLang prefill reports).",
        show_default=False)] = None,
    config: Annotated[Optional[str], typer.Option(  # noqa: UP045
        "-c", "--config", metavar="DEPLOY",
        help="Also check each server against this deployment file or preset (what it asked for).",
        show_default=False)] = None,
    set_: SetOption = None,
    timeout: Annotated[float, typer.Option("--timeout", min=0.1, metavar="S",
                                           help="Seconds to wait for prefill's bootstrap to register.")] = 30.0,
    fmt: Annotated[OutputFormat, typer.Option("--format", help="Report format.")] = OutputFormat.text,
) -> None:
    """Check that a running prefill and decode server agree (and match a deployment) before routing to them."""
    from specctl.preflight.check import deployment_roles_of, pair_urls_of, run_preflight

    with handle_errors():
        roles = None
        if config is not None:
            from specctl.schemas.validator import load_deployment

            deployment = load_deployment(config, overrides=tuple(set_ or ()))
            roles = deployment_roles_of(deployment)
            if prefill is None or decode is None:
                p_url, d_url, boot = pair_urls_of(deployment)
                prefill, decode = prefill or p_url, decode or d_url
                bootstrap_port = bootstrap_port if bootstrap_port is not None else boot
        elif set_:
            raise UsageError("--set applies to a deployment (-c)")
        if prefill is None or decode is None:
            raise UsageError("give --prefill URL and --decode URL, or -c DEPLOY whose roles say where they run",
                             hint="e.g. specctl preflight --prefill http://10.0.0.1:30001 --decode http://10.0.0.2:30002")
        try:
            report = run_preflight(prefill, decode, bootstrap_port=bootstrap_port, deployment_roles=roles,
                                   timeout_s=timeout)
        except SpecctlError as exc:
            if fmt is OutputFormat.json:
                typer.echo(json.dumps({"ok": False, "error": str(exc), "hint": exc.hint}, indent=2))
            raise
        if fmt is OutputFormat.json:
            typer.echo(json.dumps(report.to_json(), indent=2, default=str))
        else:
            _render(report)
        if not report.ok:
            n = len(report.differences) + len(report.drifts)
            raise RuntimeFailure(f"preflight refused the pair: {n} difference(s)",
                                 hint="fix every row above and restart the affected server; the router must not "
                                      "route to this pair")


def _fmt(value: object) -> str:
    if value is None:
        return "-"
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(str(v) for v in value) + "]"
    text = str(value)
    return text if len(text) <= 60 else text[:57] + "..."


def _render(report: PreflightReport) -> None:
    from rich.table import Table

    out = stdout_console()
    p, d = report.prefill, report.decode
    out.print(f"prefill {p.url}  ({p.engine} {p.version or ''}, {p.role}, fingerprint {p.fingerprint()})",
              highlight=False)
    out.print(f"decode  {d.url}  ({d.engine} {d.version or ''}, {d.role}, fingerprint {d.fingerprint()})",
              highlight=False)
    if report.differences:
        table = Table(title="prefill vs decode: differences", title_justify="left")
        for col in ("field", "prefill", "decode", "fix"):
            table.add_column(col, overflow="fold")
        for row in report.differences:
            fix = row.fix + (f" -- {row.detail}" if row.detail else "")
            table.add_row(row.field, _fmt(row.prefill), _fmt(row.decode), fix)
        out.print(table)
    if report.drifts:
        table = Table(title="servers vs deployment: differences", title_justify="left")
        for col in ("role", "field", "asked", "running", "fix"):
            table.add_column(col, overflow="fold")
        for drift in report.drifts:
            table.add_row(drift.role, drift.field, _fmt(drift.asked), _fmt(drift.running), drift.fix)
        out.print(table)
    for note in report.notes:
        out.print(f"note: {note}", highlight=False, markup=False)
    if report.ok:
        out.print(f"ok: prefill and decode agree on every compared field (state_types {_fmt(p.state_types)}, "
                  f"page size {_fmt(p.page_size)}, speculative {_fmt(p.speculative_algorithm)})",
                  highlight=False, markup=False)
