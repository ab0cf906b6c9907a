"""The router of a disaggregated deployment, run as a child process: the Shepherd Model Gateway (`smg`, the
default) or `sglang-router`, in PD mode in front of every prefill and decode.

Contract:
- The command line itself is `schemas.sglang.router.router_command` (torch-free, shared with the exports).
- `router_argv(deployment)` is the deployment's router as `up` runs it (`roles.router.kind`, host, port,
  round-robin balancing over every instance, a short shutdown grace, fast health checks, its own Prometheus
  port on the router's host) and `router_env()` its environment: `HF_HUB_OFFLINE=1` /
  `TRANSFORMERS_OFFLINE=1` always (a router loads its tokenizer from the `model_path` a worker reports in
  `/model_info`, a local directory, and would otherwise try a hub).
- `slow_client_warning(kind)` is the line `up` and `serve --role router` print for a router that cuts streams
  without an error event and cannot close slow clients (sglang-router: `router_shortfalls`), None for smg.
- `run_router(deployment)` runs it in the foreground until SIGINT/SIGTERM (`specctl serve --role router`)
  and returns its exit code; the launcher starts the same command beside the engines. Readiness is the
  router's `GET /readiness` (200 once it has a healthy prefill and decode); engines report healthy only when
  paired, so the router never routes to a decode that failed its handshake.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from types import FrameType
from typing import TYPE_CHECKING

from specctl.engine.serve.openai_request import MAX_REQUEST_BYTES
from specctl.errors import RuntimeFailure
from specctl.orchestrate.ports import free_port
from specctl.schemas.budget import request_budget_s
from specctl.schemas.role_config import RoleConfig
from specctl.schemas.sglang.router import (
    DEFAULT_ROUTER_KIND,
    ROUTER_MODULES,
    ROUTER_PACKAGES,
    router_command,
    router_kind,
    router_shortfalls,
)

if TYPE_CHECKING:
    from specctl.schemas.deployment import Deployment

SHUTDOWN_GRACE_S = 2
OFFLINE_ENV = {"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
def role_instances(deployment: Deployment, name: str) -> list[RoleConfig]:
    """Every instance of a role (a deployment may list several prefills or decodes)."""
    return deployment.instances(name)


def connect_host(role: RoleConfig) -> str:
    """The address a client on this host dials for a role: a wildcard bind is reached over loopback."""
    host = role.host or "127.0.0.1"
    return "127.0.0.1" if host in ("0.0.0.0", "::") else host


def http_url(role: RoleConfig) -> str:
    return f"http://{connect_host(role)}:{role.port}"


def served_model(deployment: Deployment) -> str:
    """The model id the deployment's engines serve: the target as written for specctl's engines, the
    directory SGLang loads (its served model name) for engine: sglang."""
    target = deployment.role("decode").model.target or "specctl"
    if deployment.engine == "sglang":
        from specctl.schemas.sglang.export import model_path

        return model_path(target)
    return target


def router_argv(deployment: Deployment, *, python: str = sys.executable, kind: str | None = None) -> list[str]:
    """The deployment's router as `up` and `serve --role router` run it (`kind` overrides the file's)."""
    router = deployment.role("router")
    host = router.host or "127.0.0.1"
    prefills = [(http_url(pre), pre.bootstrap_port) for pre in role_instances(deployment, "prefill")]
    decodes = [http_url(dec) for dec in role_instances(deployment, "decode")]
    extra = [
        "--policy", "round_robin",
        "--shutdown-grace-period-secs", str(SHUTDOWN_GRACE_S),
        "--health-check-interval-secs", "1",
        "--health-failure-threshold", "2",
        "--health-success-threshold", "1",
        "--log-level", os.environ.get("SPECCTL_ROUTER_LOG_LEVEL", "warn"),
        # Its Prometheus exporter would bind 0.0.0.0:29000, shared by every deployment on the host.
        "--prometheus-host", host,
        "--prometheus-port", str(router.metrics_port or free_port(host)),
    ]
    if deployment.engine != "sglang":
        # A body specctl's engines would refuse is the client's fault: the router answers 413 itself rather
        # than passing prefill's 413 on as its own 500.
        extra += ["--max-payload-size", str(MAX_REQUEST_BYTES)]
    # The request's end-to-end budget (schemas/budget.py): a stopped worker fails its requests within it.
    return router_command(prefills, decodes, kind=kind or router_kind(deployment), host=host,
                          port=int(router.port or 0), python=python,
                          request_timeout_s=request_budget_s(deployment), served_model=served_model(deployment),
                          extra=extra)


def slow_client_warning(kind: str) -> str | None:
    """What a router of this kind leaves its clients without (None for smg): `router_shortfalls`, with what to
    do about it."""
    shortfalls = router_shortfalls(kind)
    if shortfalls is None:
        return None
    return (f"{shortfalls}. Use smg, or do not expose this router to untrusted clients without a proxy that "
            "closes slow ones.")


def router_env(base: dict[str, str] | None = None) -> dict[str, str]:
    return {**(os.environ if base is None else base), **OFFLINE_ENV}


def check_installed(python: str = sys.executable, kind: str = DEFAULT_ROUTER_KIND) -> None:
    """RuntimeFailure (exit 3) naming the package to install when this interpreter lacks the router."""
    if python == sys.executable:
        import importlib.util

        if importlib.util.find_spec(ROUTER_MODULES[kind]) is None:
            raise RuntimeFailure(f"the router {kind} is not installed in this environment",
                                 hint=f"pip install {ROUTER_PACKAGES[kind]}; scripts/setup.sh installs both "
                                      "routers")


def run_router(deployment: Deployment, *, kind: str | None = None) -> int:
    """Run the router in the foreground until SIGINT/SIGTERM; its exit code (0 on a clean stop)."""
    kind = kind or router_kind(deployment)
    argv = router_argv(deployment, kind=kind)
    check_installed(kind=kind)
    warning = slow_client_warning(kind)
    if warning:
        print(f"warning: {warning}", file=sys.stderr, flush=True)
    proc = subprocess.Popen(argv, env=router_env(), stdin=subprocess.DEVNULL)

    def forward(signum: int, frame: FrameType | None) -> None:
        if proc.poll() is None:
            proc.send_signal(signum)

    old = {s: signal.signal(s, forward) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        code = proc.wait()
    finally:
        for s, h in old.items():
            signal.signal(s, h)
        if proc.poll() is None:
            proc.kill()
            proc.wait(5)
    if code in (0, -signal.SIGTERM, -signal.SIGINT, 128 + signal.SIGTERM, 130):
        return 0
    raise RuntimeFailure(f"the router ({kind}) exited with code {code}",
                         hint="its log is above; check that every prefill and decode URL answers /health")
