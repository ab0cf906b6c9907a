"""One serving process per role: colocated, prefill or decode behind the same HTTP front; the router is
smg, or SGLang's sglang-router (orchestrate/router.py).

Contract: `serve_role(deployment, role_name, instance=0)` runs one process of that role until SIGINT/SIGTERM
(exit 0) or a fatal failure (exit 3, e.g. a refused handshake). Every engine role answers `/health` (503
with a `status` of `loading`, `pairing`, `refused` or `down` until it can serve, then 200), `/metrics`,
`/server_info` (SGLang's keys plus specctl's fingerprints) and SGLang's native surface (serve/sglang_http.py) on
its `host:port`. This module only picks the backend and runs the process; the backends are
serve/backend.py (colocated: `EngineBackend`), serve/prefill.py and serve/decode.py.

- colocated: one Engine (prefill + decode) behind an AsyncEngine; the OpenAI API and `/generate`.
- prefill (serve/prefill.py): the HTTP half of each bootstrap room is prefilled in its Engine (batched),
  the KV + state sent to the decode that claimed the room.
- decode (serve/decode.py): pairs with every prefill instance through the verifying handshake before it
  is ready; claims each room's KV, imports it and continues generation (speculative, adaptive).
- router: `python -m smg launch --pd-disaggregation ...` (or sglang-router) in the foreground.

Request path, by module: the router -> serve/http + serve/sglang_http (HTTP, bootstrap fields) ->
serve/decode `DecodeBackend.generate` -> pd/messages `PdClaim` -> serve/prefill `PrefillBackend` (Engine
prefill, pd/transfer sender) -> pd/transfer receiver -> `Engine.add_imported` -> AsyncEngine stream -> SSE.
See docs/architecture.md.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
import sys
from typing import TYPE_CHECKING

from specctl.engine.serve.backend import EngineBackend, RoleContext
from specctl.engine.serve.faults import FaultPlan
from specctl.errors import RuntimeFailure, SpecctlError
from specctl.orchestrate.router import role_instances

if TYPE_CHECKING:
    from aiohttp import web

    from specctl.schemas.deployment import Deployment

__all__ = ["EngineBackend", "RoleContext", "role_instances", "serve_role"]

log = logging.getLogger("specctl.serve")

# --------------------------------------------------------------------------------------------- process


async def _run_http(ctx: RoleContext, backend: EngineBackend) -> web.AppRunner:
    from specctl.engine.serve.http import OpenAIServer, start_http

    server = OpenAIServer(backend, metrics=ctx.metrics)
    host = ctx.role.host or "127.0.0.1"
    port = ctx.role.port or 0
    runner, bound = await start_http(server.app, host, port)
    ctx.http_port = bound
    log.info("%s listening on http://%s:%d", ctx.role_name, host, bound)
    return runner


def make_backend(ctx: RoleContext) -> EngineBackend:
    if ctx.role_name == "colocated":
        return EngineBackend(ctx)
    if ctx.role_name == "prefill":
        from specctl.engine.serve.prefill import PrefillBackend

        return PrefillBackend(ctx)
    if ctx.role_name == "decode":
        from specctl.engine.serve.decode import DecodeBackend

        return DecodeBackend(ctx)
    raise RuntimeFailure(f"unknown engine role {ctx.role_name!r}", hint="one of: prefill, decode, colocated")


async def _serve(ctx: RoleContext, stop: asyncio.Event) -> int:
    backend = make_backend(ctx)
    runner = await _run_http(ctx, backend)
    load_task = asyncio.create_task(_load(ctx, backend))
    stop_task = asyncio.create_task(stop.wait())
    try:
        await asyncio.wait({load_task, stop_task}, return_when=asyncio.FIRST_COMPLETED)
        if load_task.done() and load_task.exception() is None:
            # Loaded (and paired): serve until told to stop or the backend declares a fatal failure.
            fatal_task = asyncio.create_task(backend.fatal.wait())
            try:
                await asyncio.wait({stop_task, fatal_task}, return_when=asyncio.FIRST_COMPLETED)
            finally:
                fatal_task.cancel()
        if load_task.done() and load_task.exception() is not None:
            raise load_task.exception()  # type: ignore[misc]
        if ctx.state.fatal is not None:
            raise ctx.state.fatal
        return 0
    finally:
        ctx.state.set("stopping")
        for t in (load_task, stop_task):
            t.cancel()
        with contextlib.suppress(Exception):
            await asyncio.wait_for(backend.close(), 10)
        log.debug("backend closed")
        with contextlib.suppress(Exception):
            await asyncio.wait_for(runner.cleanup(), 5)
        log.debug("http closed")


async def _load(ctx: RoleContext, backend: EngineBackend) -> None:
    ctx.state.set("loading", "loading the model")
    await backend.load()
    if ctx.role_name in ("colocated",):
        ctx.state.set("ready", ready=True)


def serve_role(deployment: Deployment, role_name: str, instance: int = 0, *, faults: FaultPlan | None = None) -> int:
    """Run one role until SIGINT/SIGTERM; returns the exit code (raises RuntimeFailure on fatal errors).
    `instance` picks one of several prefill or decode instances; `faults` is a test's FaultPlan."""
    if role_name == "router":
        from specctl.orchestrate.router import run_router

        return run_router(deployment)
    instances = role_instances(deployment, role_name)
    if not 0 <= instance < len(instances):
        from specctl.errors import UsageError

        raise UsageError(f"roles.{role_name} has {len(instances)} instance(s); --instance {instance} is not one",
                         hint=f"use --instance 0..{len(instances) - 1}")
    role = instances[instance]
    ctx = RoleContext(deployment=deployment, role_name=role_name, role=role, faults=faults or FaultPlan())
    _setup_logging(role_name)

    async def main() -> int:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            with contextlib.suppress(NotImplementedError, RuntimeError):
                loop.add_signal_handler(sig, stop.set)
        return await _serve(ctx, stop)

    try:
        return asyncio.run(main())
    except SpecctlError:
        raise
    except Exception as exc:  # a bug or an environment failure: still exit 3 with a one-line reason
        log.exception("%s failed", role_name)
        raise RuntimeFailure(f"{role_name} failed: {type(exc).__name__}: {exc}") from None


class _QuietBadHttp(logging.Filter):
    """sglang-router first tries HTTP/2 with prior knowledge on every worker connection; aiohttp answers 400
    and logs a traceback for each. That is the protocol probe of a healthy client, not an error: one line."""

    def filter(self, record: logging.LogRecord) -> bool:
        exc = record.exc_info[1] if record.exc_info else None
        if exc is not None and type(exc).__name__ == "BadHttpMessage":
            record.msg, record.args, record.exc_info, record.exc_text = (
                "rejected a malformed HTTP request (e.g. an HTTP/2 probe): %s", (str(exc).splitlines()[0],), None, None)
            record.levelno, record.levelname = logging.DEBUG, "DEBUG"
            return logging.getLogger("aiohttp.server").isEnabledFor(logging.DEBUG)
        return True


def _setup_logging(role_name: str) -> None:
    logging.getLogger("aiohttp.server").addFilter(_QuietBadHttp())
    level = os.environ.get("SPECCTL_LOG_LEVEL", "INFO").upper()
    root = logging.getLogger("specctl")
    if not root.handlers:
        handler = logging.StreamHandler(sys.stderr)
        handler.setFormatter(logging.Formatter(f"%(asctime)s {role_name} %(levelname)s %(name)s: %(message)s"))
        root.addHandler(handler)
    root.setLevel(level)
