"""The router SGLang ships in front of a disaggregated deployment, as a command line: the Shepherd Model Gateway
(`smg`, the default) or its predecessor `sglang-router` (Rust, both), each in PD mode in front of every prefill
and decode.

Contract: `router_command(prefills, decodes, *, kind, host, port, python, request_timeout_s, served_model,
extra)` is THE command line of a router, for `specctl up`, `serve --role router` and every export alike:
`smg launch --pd-disaggregation ...` (or `python -m smg launch ...` when `python` is given) or `python -m
sglang_router.launch_router --pd-disaggregation ...`, then `--prefill URL BOOTSTRAP_PORT` per prefill,
`--decode URL` per decode, `--host`, `--port`, `--request-timeout-secs` when given, and for smg
`--model-alias default=SERVED_MODEL` (smg routes by model id; SGLang's clients send `default`) and the
slow-client bounds (`--header-read-timeout-secs`, `--idle-connection-timeout-secs`,
`--stream-body-stall-timeout-secs`, each under `SLOW_CLIENT_BOUND_S`): a connection that never completes its
request head, sits idle between requests, or stalls mid-body is closed. sglang-router has no such setting.
Pure (no I/O), torch-free; an unknown `kind` is a UsageError naming `ROUTER_KINDS`. `router_kind(deployment)`
is the deployment's `roles.router.kind`, smg when unset.

`router_shortfalls(kind)` says what a router kind leaves its clients without (None for smg), the one text that
validate (TOP607), `up` and `serve --role router` show: sglang-router 0.3.2 ends a stream it cuts (its worker
killed, or the request past `--request-timeout-secs`) by closing the connection mid-body, with neither an error
event nor `[DONE]` and no flag changes that (retries and the circuit breaker off included), where smg sends an
error event and `[DONE]`; and it has no client timeouts.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from specctl.errors import UsageError

if TYPE_CHECKING:
    from specctl.schemas.deployment import Deployment

# The model name SGLang's clients send when they name none (SGLang's own servers serve it).
DEFAULT_MODEL_NAME = "default"
ROUTER_KINDS = ("smg", "sglang-router")
DEFAULT_ROUTER_KIND = "smg"
# How to install each kind, and the module that must import for it to run.
ROUTER_PACKAGES = {"smg": "smg==1.13.0 (a dependency of specctl)",
                   "sglang-router": '"specctl[sglang-router]" (sglang-router==0.3.2)'}
ROUTER_MODULES = {"smg": "smg", "sglang-router": "sglang_router"}
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


def router_kind(deployment: Deployment) -> str:
    """The deployment's router kind: `roles.router.kind`, smg when unset."""
    roles = deployment.raw.get("roles") if isinstance(deployment.raw, dict) else None
    router = roles.get("router") if isinstance(roles, dict) else None
    kind = router.get("kind") if isinstance(router, dict) else None
    return str(kind or DEFAULT_ROUTER_KIND)


def router_shortfalls(kind: str) -> str | None:
    """What a router of this kind leaves its clients without (None: nothing this module knows of)."""
    if kind == "smg":
        return None
    return (f"{kind} ends a stream it cuts (a decode killed or stopped, a request past its budget) by closing the "
            "connection mid-stream, with neither an error event nor [DONE], so a client cannot tell a cut "
            "answer from a short one; and it has no client timeouts: idle, partial-header and partial-body "
            "connections stay open until the client closes them. smg (roles.router.kind: smg, the default) "
            f"sends an error event and [DONE], and closes slow clients within {SLOW_CLIENT_BOUND_S} s")
