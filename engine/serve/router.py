"""The router of a disaggregated deployment: SGLang's own `sglang-router` (Rust), run as a child process.

Contract: `router_argv(deployment)` is the command line (`python -m sglang_router.launch_router
--pd-disaggregation --prefill URL BOOTSTRAP_PORT ... --decode URL ...`, the deployment's router host and
port, round-robin balancing over every instance, a short shutdown grace) and `router_env()` its
environment: `HF_HUB_OFFLINE=1` / `TRANSFORMERS_OFFLINE=1` always (the router loads its tokenizer from the
`model_path` a worker reports in `/model_info`, a local directory, and would otherwise try a hub).
`run_router(deployment)` runs it in the foreground until SIGINT/SIGTERM (`specctl serve --role router`)
and returns its exit code; the launcher starts the same command beside the engines. Readiness is the
router's `GET /readiness` (200 once it has a healthy prefill and decode); engines report healthy only when
paired, so the router never routes to a decode that failed its handshake.

Torch-free (the launcher imports this).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from types import FrameType
from typing import TYPE_CHECKING, Any

from specctl.engine.serve.budget import request_budget_s
from specctl.engine.serve.ports import free_port
from specctl.errors import RuntimeFailure

if TYPE_CHECKING:
    from specctl.schemas.deployment import Deployment

SHUTDOWN_GRACE_S = 2
OFFLINE_ENV = {"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}


def role_instances(deployment: Deployment, name: str) -> list[dict[str, Any]]:
    """Every instance of a role (a deployment may list several prefills or decodes)."""
    return deployment.instances(name)


def connect_host(role: dict[str, Any]) -> str:
    """The address a client on this host dials for a role: a wildcard bind is reached over loopback."""
    host = str(role.get("host") or "127.0.0.1")
    return "127.0.0.1" if host in ("0.0.0.0", "::") else host


def http_url(role: dict[str, Any]) -> str:
    return f"http://{connect_host(role)}:{role['port']}"


def router_argv(deployment: Deployment, *, python: str = sys.executable) -> list[str]:
    router = deployment.role("router")
    argv = [python, "-m", "sglang_router.launch_router", "--pd-disaggregation",
            "--host", str(router.get("host") or "127.0.0.1"), "--port", str(router["port"])]
    for pre in role_instances(deployment, "prefill"):
        argv += ["--prefill", http_url(pre), str(pre["bootstrap_port"])]
    for dec in role_instances(deployment, "decode"):
        argv += ["--decode", http_url(dec)]
    argv += [
        "--policy", "round_robin",
        "--shutdown-grace-period-secs", str(SHUTDOWN_GRACE_S),
        # The request's end-to-end budget (serve/budget.py): a stopped worker fails its requests within it.
        "--request-timeout-secs", str(request_budget_s(deployment)),
        "--health-check-interval-secs", "1",
        "--health-failure-threshold", "2",
        "--health-success-threshold", "1",
        "--log-level", os.environ.get("SPECCTL_ROUTER_LOG_LEVEL", "warn"),
        # Its Prometheus exporter would bind 0.0.0.0:29000, shared by every deployment on the host.
        "--prometheus-host", str(router.get("host") or "127.0.0.1"),
        "--prometheus-port", str(router.get("metrics_port") or free_port(str(router.get("host") or "127.0.0.1"))),
    ]
    return argv


def router_env(base: dict[str, str] | None = None) -> dict[str, str]:
    return {**(os.environ if base is None else base), **OFFLINE_ENV}


def check_installed(python: str = sys.executable) -> None:
    if python == sys.executable:
        import importlib.util

        if importlib.util.find_spec("sglang_router") is None:
            raise RuntimeFailure("sglang-router is not installed in this environment",
                                 hint="pip install sglang-router==0.3.2 (scripts/setup.sh installs it)")


def run_router(deployment: Deployment) -> int:
    """Run sglang-router in the foreground until SIGINT/SIGTERM; its exit code (0 on a clean stop)."""
    check_installed()
    proc = subprocess.Popen(router_argv(deployment), env=router_env(), stdin=subprocess.DEVNULL)

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
    raise RuntimeFailure(f"sglang-router exited with code {code}",
                         hint="its log is above; check that every prefill and decode URL answers /health")
