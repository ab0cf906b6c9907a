"""EngineConfig: what one engine process needs, built from a deployment's merged role dict.

Contract: `EngineConfig.from_role(role)` takes `Deployment.role(name)` (the merged role dict:
`model`, `speculative`, `cache`, `serve`, ...) and returns a frozen config; missing optional fields
take the schema's defaults, wrong types raise `InvalidInput` naming the field. Torch-free:
`device: auto` stays "auto" here and is resolved by the engine when it imports torch.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, TypeVar

from specctl.errors import InvalidInput

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
    speculative: dict[str, Any] = field(default_factory=lambda: {"algorithm": "none"})
    # Prompt tokens prefilled per step across all requests (long prompts are chunked).
    max_prefill_tokens: int = DEFAULT_MAX_PREFILL_TOKENS
    name: str = ""
    # Verify traces (adaptive/trace.py): set by `serve --trace-out/--trace-steps` through the environment
    # (SPECCTL_TRACE_OUT / SPECCTL_TRACE_STEPS), so `up` and `bench` reach the launched engine processes.
    trace_out: str | None = None
    trace_steps: int | None = None  # draft this many every step (a counterfactual-complete trace)

    @property
    def algorithm(self) -> str:
        return str(self.speculative.get("algorithm") or "none")

    @property
    def max_draft_tokens(self) -> int:
        """Largest number of tokens one verify step scores per request (steps + 1), over every selectable step."""
        spec = self.speculative
        if self.algorithm == "none":
            return 1
        steps = [int(spec.get("num_steps") or 0)]
        adaptive = spec.get("adaptive") or {}
        for bucket in (adaptive.get("buckets") or {}).values():
            if isinstance(bucket, Mapping):
                steps.extend(int(s) for s in bucket.get("candidate_steps") or ())
        if self.trace_steps is not None:
            steps.append(self.trace_steps)
        return max(steps) + 1

    @classmethod
    def from_role(cls, role: Mapping[str, Any]) -> EngineConfig:
        model = _section(role, "model")
        cache = _section(role, "cache")
        serve = _section(role, "serve")
        spec = dict(_section(role, "speculative")) or {"algorithm": "none"}
        target = model.get("target")
        if not isinstance(target, str) or not target:
            raise InvalidInput("model.target must name a model (builtin:NAME or a local directory)")
        graph = serve.get("graph_batch_sizes") or ()
        return cls(
            model_ref=target,
            dtype=_typed(model, "model.dtype", "dtype", str, "float32"),
            device=_typed(model, "model.device", "device", str, "auto"),
            page_size=_positive(cache, "cache.page_size", "page_size", 16),
            max_tokens=_positive(cache, "cache.max_tokens", "max_tokens", 32768),
            max_batch_size=_positive(serve, "serve.max_batch_size", "max_batch_size", 32),
            graph_batch_sizes=tuple(int(b) for b in graph),
            speculative=spec,
            max_prefill_tokens=_positive(
                serve, "serve.max_prefill_tokens", "max_prefill_tokens", DEFAULT_MAX_PREFILL_TOKENS
            ),
            name=str(role.get("name") or ""),
            **_trace_settings(),
        )


def _trace_settings() -> dict[str, Any]:
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
    return {"trace_out": out, "trace_steps": steps}


def _section(role: Mapping[str, Any], key: str) -> Mapping[str, Any]:
    value = role.get(key)
    if value is None:
        return {}
    if not isinstance(value, Mapping):
        raise InvalidInput(f"{key} must be a mapping, got {type(value).__name__}")
    return value


T = TypeVar("T")


def _typed(section: Mapping[str, Any], path: str, key: str, kind: type[T], default: T) -> T:
    value = section.get(key, default)
    if value is None:
        return default
    if not isinstance(value, kind):
        raise InvalidInput(f"{path} must be a {kind.__name__}, got {value!r}")
    return value


def _positive(section: Mapping[str, Any], path: str, key: str, default: int) -> int:
    value = _typed(section, path, key, int, default)
    if isinstance(value, bool) or value < 1:
        raise InvalidInput(f"{path} must be a positive integer, got {value!r}")
    return value
