"""The HTTP backend every engine role shares: the role's context, the sampling parameters of a request,
the prompt's tokenization, and `EngineBackend` (a local Engine behind an AsyncEngine).

Contract: `RoleContext` is one serving process's deployment, role settings, metrics and `/health`
state (`RoleState`). `EngineBackend(ctx)` is what `serve/http.OpenAIServer` calls (the Backend
protocol: `health`, `encode`/`decode`, `generate`, `server_info`, `refresh_metrics`, `close`) for the
colocated role; `serve/prefill.PrefillBackend` and `serve/decode.DecodeBackend` extend it with their
half of the disaggregation protocol, sharing the helpers at the end of this module (the shared secret,
the unauthenticated-pairing warning, the draft runner whose layout is registered). Dependencies point one
way: serve/roles (the process) -> serve/prefill, serve/decode -> this module -> engine core, serve/metrics.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import os
import time
from collections.abc import AsyncIterator
from typing import TYPE_CHECKING, Any

from specctl.engine.async_engine import AsyncEngine, RequestOutput
from specctl.engine.config import EngineConfig
from specctl.engine.serve.faults import FaultPlan
from specctl.engine.serve.metrics import ServingMetrics
from specctl.engine.serve.openai_request import RequestError
from specctl.engine.serve.spec_stats import launch_steps
from specctl.engine.tokenizer import Tokenizer, prompt_token_ids
from specctl.errors import UsageError
from specctl.schemas.budget import MAX_NEW_TOKENS
from specctl.schemas.model_facts import load_model_facts
from specctl.schemas.server_info import Key, sglang_server_args

if TYPE_CHECKING:  # torch lives behind these; the serving front imports this module before any model loads
    from specctl.engine.engine import Engine
    from specctl.engine.model_runner import ModelRunner
    from specctl.engine.sampling_params import SamplingParams
    from specctl.engine.serve.openai_request import PdRoute
    from specctl.schemas.deployment import Deployment
    from specctl.schemas.role_config import RoleConfig, TransferConfig

log = logging.getLogger("specctl.serve")


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
    deployment: Deployment | None  # None for a server a test builds in process from a role config alone
    role_name: str
    role: RoleConfig
    metrics: ServingMetrics = dataclasses.field(default_factory=ServingMetrics)
    state: RoleState = dataclasses.field(default_factory=RoleState)
    started: float = dataclasses.field(default_factory=time.time)
    http_port: int = 0
    faults: FaultPlan = dataclasses.field(default_factory=FaultPlan)  # tests only (serve/faults.py)

    @property
    def transfer(self) -> TransferConfig:
        return self.role.transfer

    @property
    def timeout_s(self) -> float:
        return self.role.transfer.timeout_s

    def base_info(self) -> dict[str, Any]:
        dep = self.deployment
        return {
            Key.ROLE: self.role_name,
            "pid": os.getpid(),
            "status": self.state.status,
            "ready": self.state.ready,
            "uptime_s": round(time.time() - self.started, 3),
            "deployment": {"name": dep.name if dep else None, "path": dep.path if dep else None,
                           "raw": dep.raw if dep else None},
            Key.RESOLVED_ROLE: self.role.to_json(),
        }


# How to fix a PD room whose other half never came (prefill and decode both say it, with a 408).


def model_name_of(role: RoleConfig) -> str:
    return role.model.target or "specctl"


def max_context_of(model_ref: str) -> int:
    facts = load_model_facts(model_ref)
    return int(facts.config.get("max_position_embeddings") or 4096)


class TokenizingBackend:
    """What every HTTP backend shares: the served model's name and context, and its tokenizer
    (loaded by the subclass's `load()`), so every role tokenizes prompts the same way."""

    def __init__(self, ctx: RoleContext, role: RoleConfig) -> None:
        self.ctx = ctx
        self.model_name = model_name_of(role)
        self.max_context = max_context_of(self.model_name)
        # Behind a router whose request timeout is the request budget, a generation may not outlive it.
        self.max_new_tokens: int | None = MAX_NEW_TOKENS if ctx.role_name in ("prefill", "decode") else None
        self.tokenizer: Tokenizer | None = None  # set by the subclass's load()

    def loaded_tokenizer(self) -> Tokenizer:
        """The tokenizer; while the model (and with it the tokenizer) still loads, a 503 for the client:
        /tokenize and /detokenize answer before readiness, as SGLang's do once its tokenizer is up."""
        if self.tokenizer is None:
            raise RequestError("server not ready (loading): the tokenizer loads with the model", status=503,
                               code="service_unavailable")
        return self.tokenizer

    @property
    def vocab_size(self) -> int | None:
        return self.tokenizer.vocab_size if self.tokenizer is not None else None

    @property
    def launch_steps(self) -> int | None:
        return launch_steps(self.ctx.role)

    def encode(self, text: str) -> list[int]:
        return prompt_token_ids(self.loaded_tokenizer(), text)  # the one rule every role shares

    def decode(self, ids: list[int]) -> str:
        return self.loaded_tokenizer().decode(ids)


class EngineBackend(TokenizingBackend):
    """The HTTP backend over a local Engine (colocated role; decode reuses the engine half)."""

    supports_logprobs = True  # the engine's sequences carry them (engine/logprobs.py)
    supports_logit_processors = True  # logit_bias and penalties (engine/penalties.py)
    front_counts_prompt_tokens = True  # the engine computes the prompt here

    def __init__(self, ctx: RoleContext) -> None:
        super().__init__(ctx, ctx.role)
        self.engine: Engine | None = None
        self.aengine: AsyncEngine | None = None
        self.fatal = asyncio.Event()  # set when the role can no longer serve (the process then exits)

    async def load(self) -> None:
        from specctl.engine.engine import Engine  # noqa: PLC0415 - imports torch; this module stays torch-free

        cfg = EngineConfig.from_role(self.ctx.role)
        self.engine = await asyncio.to_thread(Engine, cfg)
        self.tokenizer = self.engine.tokenizer
        # A request the KV pool can never hold is the client's to fix: the front answers 400, not the engine 503.
        self.max_context = min(self.max_context, int(self.engine.scheduler.max_request_tokens()))
        self.aengine = AsyncEngine(self.engine, name=self.ctx.role_name).start()

    # Backend protocol -----------------------------------------------------------------------------
    def health(self) -> tuple[bool, dict[str, Any]]:
        ready, detail = self.ctx.state.health()
        if ready and (self.aengine is None or not self.aengine.alive):
            return False, {"status": "down", "detail": "engine thread stopped"}
        return ready, detail

    def check_params(self, params: SamplingParams, route: PdRoute | None) -> None:
        """A colocated engine serves every request the front accepted (a PD route is not needed, and ignored)."""

    def load_info(self) -> dict[str, int]:
        return {}  # the front's own count of requests in flight

    async def generate(self, prompt_ids: list[int], params: SamplingParams, *, route: PdRoute | None = None,
                       stream: bool = True) -> AsyncIterator[RequestOutput]:
        assert self.aengine is not None
        async for item in self.aengine.generate(prompt_ids, params, coalesce=not stream):
            yield item

    async def engine_stats(self) -> dict[str, Any]:
        if self.aengine is None:
            return {}
        try:
            stats = await self.aengine.call(lambda eng: eng.stats(), timeout=10)
            return dict(stats) if isinstance(stats, dict) else {}
        except Exception as exc:  # stats are best effort: /server_info must answer while busy
            return {"error": str(exc)}

    async def server_info(self) -> dict[str, Any]:
        info = self.ctx.base_info()
        stats = await self.engine_stats()
        info[Key.ENGINE] = stats
        info[Key.FINGERPRINTS] = engine_fingerprints(self.engine)
        spec = stats.get("speculative") if isinstance(stats, dict) else None
        info[Key.ADAPTIVE_STATE] = None if not isinstance(spec, dict) else {
            k: spec.get(k) for k in ("mode", "initial_steps", "buckets", "switches", "acceptance_rate",
                                     "acceptance_histogram", "batches_per_steps", Key.MEAN_TOKENS_PER_VERIFY)}
        info["timing"] = self.timing()
        rate = (spec or {}).get(Key.MEAN_TOKENS_PER_VERIFY) if isinstance(spec, dict) else None
        info.update(sglang_server_args(self.ctx.role.to_json(), self.ctx.role_name,
                                       accept_length=float(rate) if isinstance(rate, (int, float)) else None))
        target = info[Key.FINGERPRINTS].get("target") or {}
        if target.get(Key.STATE_TYPES) is not None:
            info[Key.STATE_TYPES] = list(target[Key.STATE_TYPES])  # the live cache's, in registration order
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


def engine_fingerprints(engine: Engine | None) -> dict[str, Any]:
    out: dict[str, Any] = {}
    if engine is not None:
        runner = engine.runner
        with contextlib.suppress(Exception):
            layout = runner.layout()
            out["target"] = {"weights_hash": layout.weights_hash, "architecture": layout.architecture,
                             "dtype": layout.dtype, "page_size": layout.page_size,
                             "state_types": list(layout.state_types)}
    return out


def update_engine_gauges(metrics: ServingMetrics, stats: dict[str, Any], engine: Engine | None) -> None:
    if isinstance(stats, dict) and isinstance(stats.get("num_running"), int):
        metrics.running.set(stats["num_running"])
        metrics.waiting.set(int(stats.get("num_waiting") or 0))
    if engine is not None:
        runner = engine.runner
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


# --------------------------------------------------------------------------------------------- PD, both halves


def secret_of(ctx: RoleContext) -> str | None:
    name = ctx.transfer.secret_env
    if not name:
        return None
    value = os.environ.get(str(name))
    if not value:
        raise UsageError(f"transfer.secret_env names ${name}, which is not set in this process's environment")
    return value


def warn_unauthenticated(ctx: RoleContext, host: str) -> None:
    if secret_of(ctx) is None:
        log.warning("PD pairing is unauthenticated (no transfer.secret_env): any local process may register "
                    "with the bootstrap endpoint; keep the PD plane on loopback (host %s) or set a shared secret",
                    host)


def draft_runner_of(engine: Engine | None) -> ModelRunner | None:
    """The draft model's runner (a draft-model drafter only; n-gram drafting and plain decoding have none)."""
    return engine.decoder.draft_runner if engine is not None else None
