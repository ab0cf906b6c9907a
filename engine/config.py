"""EngineConfig: what one engine process needs, built from a deployment's role config.

Contract: `EngineConfig.from_role(role)` takes `Deployment.role(name)` (a `RoleConfig`, typed and checked
when the deployment was loaded) and returns a frozen config; a role without a `model.target` raises
`InvalidInput`. Torch-free: `device: auto` stays "auto" here and is resolved by the engine when it
imports torch.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from specctl.errors import InvalidInput
from specctl.schemas.role_config import RoleConfig, SpeculativeConfig

DEFAULT_MAX_PREFILL_TOKENS = 2048


@dataclass(frozen=True)
class EngineConfig:
    model_ref: str
    dtype: str = "float32"
    device: str = "auto"  # auto | cpu | cuda[:N]
    page_size: int = 16
    max_tokens: int = 32768  # KV pool capacity in tokens
    max_batch_size: int = 32
    graph_batch_sizes: tuple[int, ...] = ()
    speculative: SpeculativeConfig = field(default_factory=SpeculativeConfig)
    # Prompt tokens prefilled per step across all requests (long prompts are chunked).
    max_prefill_tokens: int = DEFAULT_MAX_PREFILL_TOKENS
    name: str = ""
    # Verify traces (adaptive/trace.py): set by `serve --trace-out/--trace-steps` through the environment
    # (SPECCTL_TRACE_OUT / SPECCTL_TRACE_STEPS), so `up` and `bench` reach the launched engine processes.
    trace_out: str | None = None
    trace_steps: int | None = None  # draft this many every step (a counterfactual-complete trace)

    @property
    def algorithm(self) -> str:
        return self.speculative.algorithm

    @property
    def max_draft_tokens(self) -> int:
        """Largest number of tokens one verify step scores per request (steps + 1), over every selectable step."""
        if self.algorithm == "none":
            return 1
        steps = list(self.speculative.selectable_steps())
        if self.trace_steps is not None:
            steps.append(self.trace_steps)
        return max(steps) + 1

    @classmethod
    def from_role(cls, role: RoleConfig) -> EngineConfig:
        target = role.model.target
        if not target:
            raise InvalidInput("model.target must name a model (builtin:NAME or a local directory)")
        prefill_tokens = role.serve.max_prefill_tokens
        if prefill_tokens is not None and prefill_tokens < 1:
            raise InvalidInput(f"serve.max_prefill_tokens must be a positive integer, got {prefill_tokens!r}")
        trace_out, trace_steps = _trace_settings()
        return cls(
            model_ref=target,
            dtype=role.model.dtype,
            device=role.model.device,
            page_size=role.cache.page_size,
            max_tokens=role.cache.max_tokens,
            max_batch_size=role.serve.max_batch_size,
            graph_batch_sizes=role.serve.graph_batch_sizes,
            speculative=role.speculative,
            max_prefill_tokens=prefill_tokens or DEFAULT_MAX_PREFILL_TOKENS,
            name=role.name,
            trace_out=trace_out,
            trace_steps=trace_steps,
        )


def _trace_settings() -> tuple[str | None, int | None]:
    """`trace_out` / `trace_steps` from the environment `serve --trace-out/--trace-steps` sets."""
    import os

    from specctl.adaptive.trace import TRACE_OUT_ENV, TRACE_STEPS_ENV

    out = os.environ.get(TRACE_OUT_ENV) or None
    raw = os.environ.get(TRACE_STEPS_ENV) or None
    steps = None
    if raw is not None:
        try:
            steps = int(raw)
        except ValueError:
            steps = 0
        if steps < 1:
            raise InvalidInput(f"{TRACE_STEPS_ENV}={raw!r}: --trace-steps must be a positive integer")
        if out is None:
            raise InvalidInput("--trace-steps needs --trace-out: a counterfactual trace must be written somewhere")
    return out, steps
