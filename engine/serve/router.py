"""The router of a disaggregated deployment, run as a child process: the Shepherd Model Gateway (`smg`, the
default) or SGLang's `sglang-router` (Rust, both), each in PD mode in front of every prefill and decode.

Contract:
- `router_command(prefills, decodes, *, kind, host, port, python, request_timeout_s, extra)` is THE command
  line of a router, for `specctl up`, `serve --role router` and every export alike: `smg launch
  --pd-disaggregation ...` (or `python -m smg launch ...` when `python` is given) or `python -m
  sglang_router.launch_router --pd-disaggregation ...`, then `--prefill URL BOOTSTRAP_PORT` per prefill,
  `--decode URL` per decode, `--host`, `--port`, `--request-timeout-secs` when given, and for smg
  `--model-alias default=SERVED_MODEL` (smg routes by model id; SGLang's clients send `default`) and the
  slow-client bounds (`--header-read-timeout-secs`, `--idle-connection-timeout-secs`,
  `--stream-body-stall-timeout-secs`, each under `SLOW_CLIENT_BOUND_S`): a connection that never completes
  its request head, sits idle between requests, or stalls mid-body is closed. sglang-router has no such
  setting. Pure (no I/O), torch-free; an unknown `kind` is a UsageError naming `ROUTER_KINDS`.
- `router_argv(deployment)` is the deployment's router as `up` runs it (`roles.router.kind`, host, port,
  round-robin balancing over every instance, a short shutdown grace, fast health checks, its own Prometheus
  port on the router's host) and `router_env()` its environment: `HF_HUB_OFFLINE=1` /
  `TRANSFORMERS_OFFLINE=1` always (a router loads its tokenizer from the `model_path` a worker reports in
  `/model_info`, a local directory, and would otherwise try a hub).
- `slow_client_warning(kind)` is the line `up` and `serve --role router` print for a router that cannot
  close slow clients (sglang-router), None for smg.
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
from collections.abc import Sequence
from types import FrameType
from typing import TYPE_CHECKING, Any

from specctl.engine.serve.openai_request import DEFAULT_MODEL_NAME
from specctl.engine.serve.ports import free_port
from specctl.errors import RuntimeFailure, UsageError

if TYPE_CHECKING:
    from specctl.schemas.deployment import Deployment

ROUTER_KINDS = ("smg", "sglang-router")
DEFAULT_ROUTER_KIND = "smg"
# How to install each kind, and the module that must import for it to run.
ROUTER_PACKAGES = {"smg": "smg==1.13.0 (a dependency of specctl)",
                   "sglang-router": '"specctl[sglang-router]" (sglang-router==0.3.2)'}
ROUTER_MODULES = {"smg": "smg", "sglang-router": "sglang_router"}
SHUTDOWN_GRACE_S = 2
OFFLINE_ENV = {"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
# A client connection the router holds with no request in progress closes within this bound.
SLOW_CLIENT_BOUND_S = 30
# smg: a request head must arrive whole this soon after the connection opens (or after its first byte).
HEADER_READ_TIMEOUT_S = 10
# smg: a keep-alive connection with no request in flight closes after this long (an open stream counts as
# in flight); under SLOW_CLIENT_BOUND_S, above the few seconds a client's pool waits between requests.
IDLE_CONNECTION_TIMEOUT_S = 20
# smg: a streamed request body the router has waited on for this long is cut with 408.
BODY_STALL_TIMEOUT_S = 10


def router_command(
    prefills: Sequence[tuple[str, int | None]],
    decodes: Sequence[str],
    *,
    kind: str = DEFAULT_ROUTER_KIND,
    host: str = "127.0.0.1",
    port: int = 30000,
    python: str | None = None,
    request_timeout_s: int | None = None,
    served_model: str | None = None,
    extra: Sequence[str] = (),
) -> list[str]:
    """One router's argv (see the module contract). `prefills`: (URL, bootstrap port or None) per prefill
    instance; `decodes`: one URL per decode instance; `python`: run the router as that interpreter's module
    (what `up` does) instead of the `smg` console script; `served_model`: the model id the workers serve,
    which smg then also answers to as SGLang's default name `default`; `extra`: appended as given."""
    if kind not in ROUTER_KINDS:
        raise UsageError(f"unknown router kind {kind!r}: the router is one of {', '.join(ROUTER_KINDS)}",
                         hint="set roles.router.kind (or --router) to smg (the default) or sglang-router")
    if not prefills or not decodes:
        raise UsageError("a PD router needs at least one prefill and one decode URL",
                         hint="declare roles.prefill and roles.decode in the deployment")
    if kind == "smg":
        argv = ["smg", "launch"] if python is None else [python, "-m", "smg", "launch"]
    else:
        argv = [python or "python", "-m", "sglang_router.launch_router"]
    argv.append("--pd-disaggregation")
    for url, bootstrap in prefills:
        argv += ["--prefill", url, "none" if bootstrap is None else str(bootstrap)]
    for url in decodes:
        argv += ["--decode", url]
    argv += ["--host", host, "--port", str(port)]
    if request_timeout_s is not None:
        argv += ["--request-timeout-secs", str(int(request_timeout_s))]
    if kind == "smg" and served_model and served_model != DEFAULT_MODEL_NAME:
        argv += ["--model-alias", f"{DEFAULT_MODEL_NAME}={served_model}"]
    if kind == "smg":
        argv += ["--header-read-timeout-secs", str(HEADER_READ_TIMEOUT_S),
                 "--idle-connection-timeout-secs", str(IDLE_CONNECTION_TIMEOUT_S),
                 "--stream-body-stall-timeout-secs", str(BODY_STALL_TIMEOUT_S)]
    return [*argv, *extra]


def role_instances(deployment: Deployment, name: str) -> list[dict[str, Any]]:
    """Every instance of a role (a deployment may list several prefills or decodes)."""
    return deployment.instances(name)


def connect_host(role: dict[str, Any]) -> str:
    """The address a client on this host dials for a role: a wildcard bind is reached over loopback."""
    host = str(role.get("host") or "127.0.0.1")
    return "127.0.0.1" if host in ("0.0.0.0", "::") else host


def http_url(role: dict[str, Any]) -> str:
    return f"http://{connect_host(role)}:{role['port']}"


def router_kind(deployment: Deployment) -> str:
    """The deployment's router kind: `roles.router.kind`, smg when unset."""
    roles = deployment.raw.get("roles") if isinstance(deployment.raw, dict) else None
    router = roles.get("router") if isinstance(roles, dict) else None
    kind = router.get("kind") if isinstance(router, dict) else None
    return str(kind or DEFAULT_ROUTER_KIND)


def served_model(deployment: Deployment) -> str:
    """The model id the deployment's engines serve: the target as written for specctl's engines, the
    directory SGLang loads (its served model name) for engine: sglang."""
    target = str((deployment.role("decode").get("model") or {}).get("target") or "specctl")
    if deployment.engine == "sglang":
        from specctl.schemas.sglang.export import model_path

        return model_path(target)
    return target


def router_argv(deployment: Deployment, *, python: str = sys.executable, kind: str | None = None) -> list[str]:
    """The deployment's router as `up` and `serve --role router` run it (`kind` overrides the file's)."""
    router = deployment.role("router")
    decode = deployment.role("decode")
    timeout_s = float((decode.get("transfer") or {}).get("timeout_s", 30))
    host = str(router.get("host") or "127.0.0.1")
    prefills = [(http_url(pre), pre.get("bootstrap_port")) for pre in role_instances(deployment, "prefill")]
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
        "--prometheus-port", str(router.get("metrics_port") or free_port(host)),
    ]
    # A request may wait for its KV up to the transfer timeout, then decode for minutes on a CPU; the engines
    # fail a stuck request themselves (transfer.timeout_s), this only bounds a hung worker.
    return router_command(prefills, decodes, kind=kind or router_kind(deployment), host=host,
                          port=int(router["port"]), python=python,
                          request_timeout_s=int(max(600.0, timeout_s * 4)), served_model=served_model(deployment),
                          extra=extra)


def slow_client_warning(kind: str) -> str | None:
    """What a router of this kind leaves open to slow clients (None: it closes them within the bound)."""
    if kind == "smg":
        return None
    return (f"{kind} has no client timeouts: idle, partial-header and partial-body connections stay open "
            f"until the client closes them; smg (roles.router.kind: smg, the default) closes them within "
            f"{SLOW_CLIENT_BOUND_S} s. Do not expose this router to untrusted clients without a proxy that does.")


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
