"""RoleConfig: one role's merged settings as a frozen, typed value, built once when the deployment is loaded.

Contract: `RoleConfig.from_json(merged)` reads a merged role dict (`deployment.merge_role`: the top-level
`model` / `speculative` / `cache` / `serve` / `transfer` sections with the role's overrides on top, defaults
filled, plus `name`, `host`, `port`, `bootstrap_port`, and the router's `metrics_port` and `kind`). A missing
optional field takes the schema's default; a wrong type raises `InvalidInput` naming the field. This is the
parse edge: everything past it (the engine config, the registration, the SGLang argv, the launcher) reads the
typed sections. `to_json()` gives back the merged dict it was read from, unchanged (for `/server_info`, the
live preflight's comparison and other JSON outputs); `SpeculativeConfig.from_json` reads a `speculative`
block alone. `speculative.adaptive` stays the document's JSON block (SGLang's adaptive-config shape), which
`schemas/adaptive` parses where the policy is built.

Torch-free: `specctl validate` and the orchestration import it.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, TypeVar

from specctl.errors import InvalidInput

T = TypeVar("T")

DEFAULT_TIMEOUT_S = 30.0


def _section(doc: Mapping[str, Any], key: str) -> Mapping[str, Any]:
    value = doc.get(key)
    if value is None:
        return {}
    if not isinstance(value, Mapping):
        raise InvalidInput(f"{key} must be a mapping, got {type(value).__name__}")
    return value


def _typed(section: Mapping[str, Any], path: str, kinds: type[T] | tuple[type, ...], default: T) -> T:
    value = section.get(path.rsplit(".", 1)[-1], default)
    if value is None:
        return default
    if isinstance(value, bool) and kinds is not bool or not isinstance(value, kinds):
        names = kinds.__name__ if isinstance(kinds, type) else " or ".join(k.__name__ for k in kinds)
        raise InvalidInput(f"{path} must be a {names}, got {value!r}")
    return value  # type: ignore[return-value]  # checked against `kinds` just above


def _optional(section: Mapping[str, Any], path: str, kind: type[T]) -> T | None:
    value = section.get(path.rsplit(".", 1)[-1])
    if value is None:
        return None
    if isinstance(value, bool) and kind is not bool or not isinstance(value, kind):
        raise InvalidInput(f"{path} must be a {kind.__name__}, got {value!r}")
    return value


def _positive(section: Mapping[str, Any], path: str, default: int) -> int:
    value = _typed(section, path, int, default)
    if value < 1:
        raise InvalidInput(f"{path} must be a positive integer, got {value!r}")
    return value


def _ints(section: Mapping[str, Any], path: str) -> tuple[int, ...]:
    value = section.get(path.rsplit(".", 1)[-1]) or ()
    if not isinstance(value, (list, tuple)) or any(isinstance(v, bool) or not isinstance(v, int) for v in value):
        raise InvalidInput(f"{path} must be a list of integers, got {value!r}")
    return tuple(value)


def _strs(section: Mapping[str, Any], path: str) -> tuple[str, ...] | None:
    value = section.get(path.rsplit(".", 1)[-1])
    if value is None:
        return None
    if not isinstance(value, (list, tuple)) or any(not isinstance(v, str) for v in value):
        raise InvalidInput(f"{path} must be a list of names, got {value!r}")
    return tuple(value)


@dataclass(frozen=True)
class ModelConfig:
    target: str | None = None  # builtin:NAME or a local model directory
    dtype: str = "float32"
    device: str = "auto"  # auto | cpu | cuda[:N]

    @classmethod
    def from_json(cls, doc: Mapping[str, Any]) -> ModelConfig:
        return cls(target=_optional(doc, "model.target", str), dtype=_typed(doc, "model.dtype", str, "float32"),
                   device=_typed(doc, "model.device", str, "auto"))


@dataclass(frozen=True)
class NgramConfig:
    min_match: int = 1
    max_match: int = 4


@dataclass(frozen=True)
class SpeculativeConfig:
    algorithm: str = "none"  # none | draft | ngram
    draft: str | None = None  # the draft model (algorithm: draft)
    num_steps: int | None = None  # initial draft steps per verify (None: not written; merge_role fills it)
    topk: int = 1
    adaptive: Mapping[str, Any] | None = None  # the document's adaptive block (module docstring)
    ngram: NgramConfig = field(default_factory=NgramConfig)

    @classmethod
    def from_json(cls, doc: Mapping[str, Any]) -> SpeculativeConfig:
        ngram = _section(doc, "ngram")
        adaptive = doc.get("adaptive")
        if adaptive is not None and not isinstance(adaptive, Mapping):
            raise InvalidInput(f"speculative.adaptive must be a mapping, got {type(adaptive).__name__}")
        return cls(
            algorithm=_typed(doc, "speculative.algorithm", str, "none"),
            draft=_optional(doc, "speculative.draft", str),
            num_steps=_optional(doc, "speculative.num_steps", int),
            topk=_typed(doc, "speculative.topk", int, 1),
            adaptive=adaptive,
            ngram=NgramConfig(min_match=_typed(ngram, "speculative.ngram.min_match", int, 1),
                              max_match=_typed(ngram, "speculative.ngram.max_match", int, 4)),
        )

    def to_json(self) -> dict[str, Any]:
        """The block as the schema writes it (`num_steps` only when set)."""
        out: dict[str, Any] = {"algorithm": self.algorithm, "draft": self.draft, "topk": self.topk,
                               "adaptive": copy.deepcopy(dict(self.adaptive)) if self.adaptive is not None else None,
                               "ngram": {"min_match": self.ngram.min_match, "max_match": self.ngram.max_match}}
        if self.num_steps is not None:
            out["num_steps"] = self.num_steps
        return out

    def selectable_steps(self) -> tuple[int, ...]:
        """The initial steps and every adaptive bucket's candidates (what one verify may run)."""
        steps = [self.num_steps or 0]
        buckets = (self.adaptive or {}).get("buckets") or {}
        for bucket in buckets.values() if isinstance(buckets, Mapping) else ():
            if isinstance(bucket, Mapping):
                steps.extend(int(s) for s in bucket.get("candidate_steps") or ())
        return tuple(steps)


@dataclass(frozen=True)
class CacheConfig:
    page_size: int = 16
    max_tokens: int = 32768  # KV pool capacity in tokens
    state_types: tuple[str, ...] | None = None  # written in the file (None: derived from the model)


@dataclass(frozen=True)
class ServeConfig:
    max_batch_size: int = 32
    graph_batch_sizes: tuple[int, ...] = ()
    max_prefill_tokens: int | None = None  # prompt tokens prefilled per step (None: the engine's default)


@dataclass(frozen=True)
class TransferConfig:
    backend: str = "zmq"  # zmq | shm
    protocol: str = "tcp"  # tcp | ipc
    timeout_s: float = DEFAULT_TIMEOUT_S
    secret_env: str | None = None  # the environment variable holding the PD shared secret


@dataclass(frozen=True)
class RoleConfig:
    name: str
    host: str = "127.0.0.1"
    port: int | None = None
    bootstrap_port: int | None = None
    model: ModelConfig = field(default_factory=ModelConfig)
    speculative: SpeculativeConfig = field(default_factory=SpeculativeConfig)
    cache: CacheConfig = field(default_factory=CacheConfig)
    serve: ServeConfig = field(default_factory=ServeConfig)
    transfer: TransferConfig = field(default_factory=TransferConfig)
    metrics_port: int | None = None  # router only
    kind: str | None = None  # router only: smg | sglang-router
    doc: Mapping[str, Any] = field(default_factory=dict, repr=False, compare=False)  # the merged dict

    @classmethod
    def from_json(cls, doc: Mapping[str, Any]) -> RoleConfig:
        cache, serve, transfer = _section(doc, "cache"), _section(doc, "serve"), _section(doc, "transfer")
        timeout = _typed(transfer, "transfer.timeout_s", (int, float), DEFAULT_TIMEOUT_S)
        return cls(
            name=_typed(doc, "name", str, ""),
            host=_typed(doc, "host", str, "127.0.0.1"),
            port=_optional(doc, "port", int),
            bootstrap_port=_optional(doc, "bootstrap_port", int),
            model=ModelConfig.from_json(_section(doc, "model")),
            speculative=SpeculativeConfig.from_json(_section(doc, "speculative")),
            cache=CacheConfig(page_size=_positive(cache, "cache.page_size", 16),
                              max_tokens=_positive(cache, "cache.max_tokens", 32768),
                              state_types=_strs(cache, "cache.state_types")),
            serve=ServeConfig(max_batch_size=_positive(serve, "serve.max_batch_size", 32),
                              graph_batch_sizes=_ints(serve, "serve.graph_batch_sizes"),
                              max_prefill_tokens=_optional(serve, "serve.max_prefill_tokens", int)),
            transfer=TransferConfig(backend=_typed(transfer, "transfer.backend", str, "zmq"),
                                    protocol=_typed(transfer, "transfer.protocol", str, "tcp"),
                                    timeout_s=float(timeout),
                                    secret_env=_optional(transfer, "transfer.secret_env", str)),
            metrics_port=_optional(doc, "metrics_port", int),
            kind=_optional(doc, "kind", str),
            doc=doc,
        )

    def to_json(self) -> dict[str, Any]:
        """The merged role dict this config was read from (a copy)."""
        return copy.deepcopy(dict(self.doc))
