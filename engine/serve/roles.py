"""Per-role serving processes: colocated, prefill and decode behind the same HTTP front; the router is
SGLang's own sglang-router (engine/serve/router.py).

Contract: `serve_role(deployment, role_name, instance=0)` runs one process of that role until SIGINT/SIGTERM
(exit 0) or a fatal failure (exit 3, e.g. a refused handshake). Every engine role answers `/health` (503
with a `status` of `loading`, `pairing`, `refused` or `down` until it can serve, then 200), `/metrics`,
`/server_info` (SGLang's keys plus specctl's fingerprints) and SGLang's native surface (sglang_http.py) on
its `host:port`.

- colocated: one Engine (prefill + decode) behind an AsyncEngine; the OpenAI API and `/generate`.
- prefill (pd_prefill.py): the HTTP half of each bootstrap room is prefilled in its Engine (batched), the
  KV + state sent to the decode that claimed the room.
- decode (pd_decode.py): pairs with every prefill instance through the verifying handshake before it is
  ready; claims each room's KV, imports it and continues generation (speculative, adaptive).
- router: `python -m sglang_router.launch_router --pd-disaggregation ...` in the foreground.

Request path, by module: sglang-router -> http_server / sglang_http (HTTP, bootstrap fields) ->
pd_decode.DecodeBackend.generate -> pd_protocol.PdClaim -> pd_prefill.PrefillBackend (Engine prefill,
transfer.TransferSender) -> transfer.TransferReceiver -> Engine.add_imported -> AsyncEngine stream -> SSE.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import os
import signal
import sys
import time
import uuid
from collections.abc import AsyncIterator
from typing import Any

from specctl.engine.async_engine import AsyncEngine, RequestOutput
from specctl.engine.serve.metrics import ServingMetrics
from specctl.engine.serve.router import role_instances
from specctl.errors import RuntimeFailure, SpecctlError

__all__ = ["role_instances", "serve_role"]

log = logging.getLogger("specctl.serve")

HEALTH_POLL_S = 0.5


class HandshakeRefused(RuntimeFailure):
    """Prefill refused this decode: the diff was printed; the process exits 3."""


@dataclasses.dataclass
class RoleState:
    """What /health reports. `ready` flips only after loading (and, for decode, pairing)."""

    status: str = "loading"
    detail: str = ""
    ready: bool = False
    fatal: BaseException | None = None
    extra: dict[str, Any] = dataclasses.field(default_factory=dict)

    def set(self, status: str, detail: str = "", *, ready: bool = False) -> None:
        if (status, detail, ready) != (self.status, self.detail, self.ready):
            log.info("state: %s%s", status, f" ({detail})" if detail else "")
        self.status, self.detail, self.ready = status, detail, ready

    def health(self) -> tuple[bool, dict[str, Any]]:
        # The pid lets a launcher tell its own child from another process answering on the same port.
        return self.ready, {"status": self.status, "detail": self.detail, "pid": os.getpid(), **self.extra}


@dataclasses.dataclass
class RoleContext:
    deployment: Any  # schemas.deployment.Deployment
    role_name: str
    role: dict[str, Any]
    metrics: ServingMetrics = dataclasses.field(default_factory=ServingMetrics)
    state: RoleState = dataclasses.field(default_factory=RoleState)
    started: float = dataclasses.field(default_factory=time.time)
    http_port: int = 0

    @property
    def transfer(self) -> dict[str, Any]:
        return dict(self.role.get("transfer") or {})

    @property
    def timeout_s(self) -> float:
        return float(self.transfer.get("timeout_s", 30))

    def base_info(self) -> dict[str, Any]:
        dep = self.deployment
        return {
            "role": self.role_name,
            "pid": os.getpid(),
            "status": self.state.status,
            "ready": self.state.ready,
            "uptime_s": round(time.time() - self.started, 3),
            "deployment": {"name": getattr(dep, "name", None), "path": getattr(dep, "path", None),
                           "raw": getattr(dep, "raw", None)},
            "resolved_role": self.role,
        }


def sampling_params_of(params: dict[str, Any]) -> Any:
    from specctl.engine.sampling import SamplingParams

    return SamplingParams(
        max_tokens=int(params.get("max_tokens", 128)),
        temperature=float(params.get("temperature", 0.0)),
        top_k=int(params.get("top_k", 0)),
        top_p=float(params.get("top_p", 1.0)),
        seed=params.get("seed"),
        stop=tuple(params.get("stop") or ()),
        ignore_eos=bool(params.get("ignore_eos", False)),
        logprobs=params.get("logprobs"),
        presence_penalty=float(params.get("presence_penalty", 0.0)),
        frequency_penalty=float(params.get("frequency_penalty", 0.0)),
        logit_bias=tuple((int(t), float(b)) for t, b in params.get("logit_bias") or ()),
    )


def model_name_of(role: dict[str, Any]) -> str:
    return str((role.get("model") or {}).get("target") or "specctl")


def max_context_of(model_ref: str) -> int:
    from specctl.schemas.model_facts import load_model_facts

    facts = load_model_facts(model_ref)
    return int(facts.config.get("max_position_embeddings") or 4096)


# --------------------------------------------------------------------------------------------- engine-backed


class TokenizingBackend:
    """What every HTTP backend shares: the served model's name and context, and its tokenizer
    (loaded by the subclass's `load()`), so every role tokenizes prompts the same way."""

    def __init__(self, ctx: RoleContext, role: dict[str, Any]) -> None:
        self.ctx = ctx
        self.model_name = model_name_of(role)
        self.max_context = max_context_of(self.model_name)
        self.tokenizer: Any = None

    def encode(self, text: str) -> list[int]:
        return encode_prompt(self.tokenizer, text)

    def decode(self, ids: list[int]) -> str:
        return self.tokenizer.decode(ids)


class EngineBackend(TokenizingBackend):
    """The HTTP backend over a local Engine (colocated role; decode reuses the engine half)."""

    supports_logprobs = True  # the engine's sequences carry them (engine/logprobs.py)
    supports_logit_processors = True  # logit_bias and penalties (engine/penalties.py)

    def __init__(self, ctx: RoleContext) -> None:
        super().__init__(ctx, ctx.role)
        self.engine: Any = None
        self.aengine: AsyncEngine | None = None

    async def load(self) -> None:
        from specctl.engine.config import EngineConfig
        from specctl.engine.engine import Engine

        cfg = EngineConfig.from_role(self.ctx.role)
        self.engine = await asyncio.to_thread(Engine, cfg)
        self.tokenizer = engine_tokenizer(self.engine)
        # A request the KV pool can never hold is the client's to fix: the front answers 400, not the engine 503.
        self.max_context = min(self.max_context, int(self.engine.scheduler.max_request_tokens()))
        self.aengine = AsyncEngine(self.engine, name=self.ctx.role_name).start()

    # Backend protocol -----------------------------------------------------------------------------
    def health(self) -> tuple[bool, dict[str, Any]]:
        ready, detail = self.ctx.state.health()
        if ready and (self.aengine is None or not self.aengine.alive):
            return False, {"status": "down", "detail": "engine thread stopped"}
        return ready, detail

    async def generate(self, prompt_ids: list[int], params: dict[str, Any]) -> AsyncIterator[RequestOutput]:
        assert self.aengine is not None
        sp = sampling_params_of(params)
        async for item in self.aengine.generate(prompt_ids, sp):
            yield item

    async def engine_stats(self) -> dict[str, Any]:
        if self.aengine is None:
            return {}
        try:
            return await self.aengine.call(lambda eng: eng.stats(), timeout=10)
        except Exception as exc:  # stats are best effort: /server_info must answer while busy
            return {"error": str(exc)}

    async def server_info(self) -> dict[str, Any]:
        from specctl.engine.serve.sglang_http import sglang_server_args

        info = self.ctx.base_info()
        stats = await self.engine_stats()
        info["engine"] = stats
        info["fingerprints"] = engine_fingerprints(self.engine)
        spec = stats.get("speculative") if isinstance(stats, dict) else None
        info["adaptive"] = None if not isinstance(spec, dict) else {
            k: spec.get(k) for k in ("mode", "initial_steps", "buckets", "switches", "acceptance_rate",
                                     "acceptance_histogram", "batches_per_steps", "mean_tokens_per_verify")}
        info["timing"] = self.timing()
        rate = (spec or {}).get("mean_tokens_per_verify") if isinstance(spec, dict) else None
        info.update(sglang_server_args(self.ctx.role, self.ctx.role_name,
                                       accept_length=float(rate) if isinstance(rate, (int, float)) else None))
        target = info["fingerprints"].get("target") or {}
        if target.get("state_types") is not None:
            info["state_types"] = list(target["state_types"])  # the live cache's, in registration order
        return info

    def timing(self) -> dict[str, Any]:
        ae = self.aengine
        if ae is None:
            return {}
        times = list(ae.step_times)
        return {"steps": ae.steps, "failed_steps": ae.failed_steps,
                "mean_step_s": sum(times) / len(times) if times else None, "last_error": ae.last_error}

    async def refresh_metrics(self, metrics: ServingMetrics) -> None:
        stats = await self.engine_stats()
        update_engine_gauges(metrics, stats, self.engine)

    async def close(self) -> None:
        if self.aengine is not None:
            await asyncio.to_thread(self.aengine.stop)


def encode_prompt(tokenizer: Any, text: str) -> list[int]:
    """A text prompt's ids exactly as `Engine.encode_prompt` makes them (BOS, when the tokenizer has one,
    then the text): every role must tokenize alike or disaggregated output would drift from colocated."""
    bos = getattr(tokenizer, "bos_token_id", None)
    return ([bos] if bos is not None else []) + list(tokenizer.encode(text))


def engine_tokenizer(engine: Any) -> Any:
    tok = getattr(engine, "tokenizer", None)
    if tok is None:
        tok = getattr(getattr(engine, "runner", None), "tokenizer", None)
    if tok is None:
        raise RuntimeFailure("engine exposes no tokenizer")
    return tok


def engine_fingerprints(engine: Any) -> dict[str, Any]:
    out: dict[str, Any] = {}
    runner = getattr(engine, "runner", None)
    if runner is not None:
        with contextlib.suppress(Exception):
            layout = runner.layout()
            out["target"] = {k: layout.get(k) for k in ("weights_hash", "architecture", "dtype", "page_size",
                                                          "state_types")}
    return out


def update_engine_gauges(metrics: ServingMetrics, stats: dict[str, Any], engine: Any) -> None:
    if isinstance(stats, dict) and isinstance(stats.get("num_running"), int):
        metrics.running.set(stats["num_running"])
        metrics.waiting.set(int(stats.get("num_waiting") or 0))
    runner = getattr(engine, "runner", None)
    if runner is not None:
        total = int(runner.num_total_pages)
        metrics.pages_total.set(total)
        metrics.pages_used.set(total - int(runner.num_free_pages))
    spec = stats.get("speculative") if isinstance(stats, dict) else None
    if not isinstance(spec, dict):
        return
    buckets = spec.get("buckets")
    if isinstance(buckets, dict) and buckets:
        for key, b in buckets.items():
            steps = b.get("steps") if isinstance(b, dict) else b
            if isinstance(steps, (int, float)):
                metrics.adaptive_steps.set(steps, bucket=str(key))
    elif isinstance(spec.get("initial_steps"), (int, float)):
        metrics.adaptive_steps.set(spec["initial_steps"], bucket="fixed")


# --------------------------------------------------------------------------------------------- process


async def _run_http(ctx: RoleContext, backend: Any) -> Any:
    from specctl.engine.serve.http import OpenAIServer, start_http

    server = OpenAIServer(backend, metrics=ctx.metrics)
    host = str(ctx.role.get("host") or "127.0.0.1")
    port = int(ctx.role.get("port") or 0)
    runner, bound = await start_http(server.app, host, port)
    ctx.http_port = bound
    log.info("%s listening on http://%s:%d", ctx.role_name, host, bound)
    return runner


def make_backend(ctx: RoleContext) -> Any:
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
            fatal = getattr(backend, "fatal", None)
            waiters = {stop_task}
            if fatal is not None:
                waiters.add(asyncio.create_task(fatal.wait()))
            await asyncio.wait(waiters, return_when=asyncio.FIRST_COMPLETED)
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


async def _load(ctx: RoleContext, backend: Any) -> None:
    ctx.state.set("loading", "loading the model")
    await backend.load()
    if ctx.role_name in ("colocated",):
        ctx.state.set("ready", ready=True)


def serve_role(deployment: Any, role_name: str, instance: int = 0) -> int:
    """Run one role until SIGINT/SIGTERM; returns the exit code (raises RuntimeFailure on fatal errors).
    `instance` picks one of several prefill or decode instances."""
    if role_name == "router":
        from specctl.engine.serve.router import run_router

        return run_router(deployment)
    instances = role_instances(deployment, role_name)
    if not 0 <= instance < len(instances):
        from specctl.errors import UsageError

        raise UsageError(f"roles.{role_name} has {len(instances)} instance(s); --instance {instance} is not one",
                         hint=f"use --instance 0..{len(instances) - 1}")
    role = instances[instance]
    ctx = RoleContext(deployment=deployment, role_name=role_name, role=role)
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


def new_id() -> str:
    return uuid.uuid4().hex[:16]
