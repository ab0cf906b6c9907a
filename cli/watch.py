"""`specctl watch --prefill URL --decode URL [--router URL] [-c DEPLOY]`: a live view of a running pair.

Thin wrapper over `specctl.preflight.watch.Watch`: one tick every --interval seconds, shown as a table on a
terminal (Rich), as one JSON line per tick with --format json. `--once` is a CI canary: two ticks
--interval apart (a stall and a rate need two samples), then exit 0 when no alert fired, 1 on any alert, 3
when a server did not answer. Torch-free (the adaptive policy it replays for the expected tier is not torch).
"""

from __future__ import annotations

import json
import sys
import time
from typing import TYPE_CHECKING, Annotated, Any, Optional

import typer

from specctl.cli.common import OutputFormat, handle_errors, stdout_console
from specctl.cli.main import app
from specctl.cli.options import SetOption
from specctl.errors import UsageError

if TYPE_CHECKING:
    from specctl.preflight.watch import Tick, Watch

_EPILOG = (
    "Each tick reads every role's /metrics and /get_load (SGLang's sglang: metrics and specctl's specctl_ "
    "alike) and re-runs the preflight comparison, so a server that restarted with another configuration "
    "is named at once. Alerts: server_unreachable, transfer_stall (requests wait to transfer and nothing "
    "moved for --stall-after seconds), transfer_errors, pair_mismatch, deployment_drift (with -c), "
    "server_changed (its preflight fingerprint changed since the first tick), acceptance_collapse.\n\n"
    "Exit codes (--once): 0 no alert; 1 an alert; 2 usage error; 3 a server did not answer.\n\n"
    "Examples: specctl watch -c deploy.yaml; specctl watch --prefill http://10.0.0.1:30001 "
    "--decode http://10.0.0.2:30002 --router http://10.0.0.3:8000 --once --format json"
)


@app.command(epilog=_EPILOG)
def watch(
    prefill: Annotated[Optional[str], typer.Option(  # noqa: UP045 - Typer reads annotations at runtime
        "--prefill", metavar="URL", help="The prefill server (default: the deployment's prefill role).",
        show_default=False)] = None,
    decode: Annotated[Optional[str], typer.Option(  # noqa: UP045
        "--decode", metavar="URL", help="The decode server (default: the deployment's decode role).",
        show_default=False)] = None,
    router: Annotated[Optional[str], typer.Option(  # noqa: UP045
        "--router", metavar="URL", help="The router in front of them (default: the deployment's router role).",
        show_default=False)] = None,
    config: Annotated[Optional[str], typer.Option(  # noqa: UP045
        "-c", "--config", metavar="DEPLOY", help="The deployment the pair runs: each tick also checks both "
        "servers against it, and its adaptive config gives the tier expected for the observed acceptance.",
        show_default=False)] = None,
    set_: SetOption = None,
    interval: Annotated[float, typer.Option("--interval", min=0.2, metavar="S", help="Seconds between ticks.")]
    = 3.0,
    stall_after: Annotated[Optional[float], typer.Option(  # noqa: UP045
        "--stall-after", min=0.1, metavar="S", help="Seconds without a transfer while requests wait to transfer "
        "before transfer_stall (default: --interval, so a stall shows by the second tick).",
        show_default=False)] = None,
    once: Annotated[bool, typer.Option("--once", help="Two ticks --interval apart, then exit 0 (no alert), 1 (an "
                                       "alert) or 3 (a server did not answer): a CI canary.")] = False,
    ticks: Annotated[Optional[int], typer.Option(  # noqa: UP045
        "--ticks", min=1, metavar="N", help="Stop after N ticks (default: until Ctrl-C).", show_default=False)]
    = None,
    timeout: Annotated[float, typer.Option("--timeout", min=0.1, metavar="S", help="Seconds per HTTP request.")]
    = 5.0,
    fmt: Annotated[OutputFormat, typer.Option("--format", help="text (a table per tick) or json (JSON Lines).")]
    = OutputFormat.text,
) -> None:
    """Watch a running prefill/decode pair: load per role, transfers and stalls, acceptance and the adaptive
    tier, and the preflight comparison re-run on every tick."""
    with handle_errors():
        w = _build(prefill, decode, router, config, tuple(set_ or ()), stall_after or interval, timeout)
        seen: list[Tick] = []
        limit = 2 if once else ticks
        try:
            while limit is None or len(seen) < limit:
                if seen:
                    time.sleep(max(0.0, interval - (time.monotonic() - seen[-1].time)))
                tick = w.tick()
                seen.append(tick)
                if not once or len(seen) == limit:
                    _show(tick, fmt, clear=not once and limit != 1)
        except KeyboardInterrupt:
            pass
        if once:
            last = seen[-1]
            if any(a.name == "server_unreachable" for a in last.alerts):
                raise typer.Exit(3)
            if last.alerts:
                raise typer.Exit(1)


def _build(prefill: str | None, decode: str | None, router: str | None, config: str | None, sets: tuple[str, ...],
           stall_after: float, timeout: float) -> Watch:
    from specctl.preflight.check import deployment_roles_of, pair_urls_of
    from specctl.preflight.watch import Watch, policy_tier

    roles = None
    boot = None
    tier = None
    if config is not None:
        from specctl.schemas.deployment import load_deployment

        dep = load_deployment(config, overrides=sets)
        roles = deployment_roles_of(dep)
        if prefill is None or decode is None:
            p_url, d_url, boot = pair_urls_of(dep)
            prefill, decode = prefill or p_url, decode or d_url
        if router is None and "router" in dep.roles:
            r = dep.role("router")
            host = "127.0.0.1" if r.host in ("0.0.0.0", "::", "") else r.host
            router = f"http://{host}:{r.port}" if r.port is not None else None
        decode_role = roles.get("decode")
        spec = decode_role.speculative if decode_role is not None else None
        steps = spec.num_steps if spec is not None else None
        tier = policy_tier(spec.adaptive if spec is not None else None, steps if steps is not None else 1)
    elif sets:
        raise UsageError("--set applies to a deployment (-c)")
    if prefill is None or decode is None:
        raise UsageError("give --prefill URL and --decode URL, or -c DEPLOY whose roles say where they run",
                         hint="e.g. specctl watch --prefill http://10.0.0.1:30001 --decode http://10.0.0.2:30002")
    for name, url in (("--prefill", prefill), ("--decode", decode), ("--router", router)):
        if url is not None and not url.startswith(("http://", "https://")):
            raise UsageError(f"{name} must be an http:// or https:// URL, got {url!r}")
    return Watch(prefill, decode, router, bootstrap_port=boot, deployment_roles=roles, tier_model=tier,
                 stall_after_s=stall_after, timeout_s=timeout)


def _num(v: float | None, fmt: str = "{:.0f}") -> str:
    return "-" if v is None else fmt.format(v)


def _show(tick: Tick, fmt: OutputFormat, *, clear: bool) -> None:
    if fmt is OutputFormat.json:
        sys.stdout.write(json.dumps(tick.to_json(), default=str) + "\n")
        sys.stdout.flush()
        return
    from rich.table import Table

    out = stdout_console()
    if clear and out.is_terminal:
        out.clear()
    table = Table(title=f"specctl watch  tick {tick.index}  {time.strftime('%H:%M:%S')}", title_justify="left")
    for col in ("role", "url", "engine", "running", "waiting", "in transfer"):
        table.add_column(col)
    for r in tick.roles:
        table.add_row(r.role, r.url, r.family or "-", _num(r.running), _num(r.waiting), _num(r.in_transfer))
    out.print(table)
    tiers: dict[str, Any] = tick.tier
    tier_text = ", ".join(f"{k or 'steps'}: {v:.0f}" for k, v in sorted(tiers.items())) or "-"
    lines = [
        f"transfer {_num(tick.transfer_bytes_per_s and tick.transfer_bytes_per_s / 1e6, '{:.2f}')} MB/s, "
        f"errors {_num(tick.transfer_errors)}, since last transfer "
        f"{_num(tick.since_transfer_s, '{:.1f} s') if tick.since_transfer_s is not None else '- (none waiting)'}",
        f"P/D load ratio {_num(tick.pd_load_ratio, '{:.2f}')}",
        f"accept length {_num(tick.accept_length, '{:.2f}')} tokens/verify, adaptive tier "
        f"{tier_text}"
        + (f" (the deployment's config settles at {tick.expected_tier} for it)" if tick.expected_tier is not None
           else ""),
        "preflight: " + ("not run (a server is down)" if tick.preflight is None else
                         "the pair matches" if tick.preflight.get("ok") else "DIFFERENCES (see alerts)"),
    ]
    for line in lines:
        out.print(line)
    if tick.alerts:
        for a in tick.alerts:
            out.print(f"ALERT {a.name} [{a.role}]: {a.message}" + (f"  fix: {a.fix}" if a.fix else ""))
    else:
        out.print("no alerts")
