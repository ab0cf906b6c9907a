"""Adaptive speculative steps, the config model: knobs, buckets, SGLang's routing and defaults.

`AdaptiveConfig` is what SGLang would run (buckets ascending by batch-size lower bound); built only by
`adaptive_parser`. Torch-free. (Split out of `schemas/adaptive.py`, which re-exports everything.)
"""

from __future__ import annotations

import bisect
import json
import math
import re
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import Any, Literal, TypeGuard

STRATEGIES = ("ema", "throughput_aware")

# SGLang's defaults (adaptive_spec_params.AdaptiveStepSlot reads each with cfg.get(name, default)).
KNOB_DEFAULTS: dict[str, Any] = {
    "strategy": "ema",
    "ema_alpha": 0.2,
    "update_interval": 5,
    "warmup_batches": 10,
    "down_hysteresis": -0.25,
    "up_hysteresis": 0.0,
    "ceiling_coeff": 0,
}
EMA_KNOBS = ("ema_alpha", "update_interval", "warmup_batches", "down_hysteresis", "up_hysteresis", "ceiling_coeff")
# Knobs only specctl's policy reads (opt-in; their defaults are SGLang's behaviour exactly). SGLang's loader
# merges `{**cfg, **entry}` and never reads them, so an SGLang config cannot carry them (ADP220, ADP221).
SPECCTL_KNOB_DEFAULTS: dict[str, Any] = {
    # Longest stay at steps 0, in decision intervals, after repeated failed probes: each probe from 0 that
    # falls back to 0 doubles the next stay (1, 2, 4, ... up to this); a probe that holds resets it to 1.
    # 1 = SGLang: probe the next candidate at every decision.
    "zero_backoff": 1,
    # The EMA at or below which a bucket steps down to 0. Unset (None) = SGLang: 0.5 + down_hysteresis, the
    # same hysteresis as every other step's bar, so a wide negative down_hysteresis (keep a deep step while
    # half its drafts are accepted) also makes 0 unreachable; this sets the bar to 0 on its own.
    "zero_threshold": None,
}
# What SGLang does instead, per specctl-only knob (its loader never reads them): for findings and refusals.
SPECCTL_KNOB_UNDER_SGLANG: dict[str, str] = {
    "zero_backoff": "the bucket probes from steps 0 at every decision",
    "zero_threshold": "the bucket steps down to 0 only at an EMA <= 0.5 + down_hysteresis",
}
SPECCTL_KNOBS = tuple(SPECCTL_KNOB_DEFAULTS)
# Settings only SGLang's throughput_aware controller reads (throughput_aware_controller.py).
THROUGHPUT_KEYS = (
    "window_size",
    "update_interval",
    "profile_run_batch_sizes",
    "max_profile_run_batch_size",
    "profile_run_n_warmup",
    "profile_run_n_measure",
    "profile_run_seq_len",
)
_KNOWN_KEYS = ("strategy", "candidate_steps", "buckets", *EMA_KNOBS, *THROUGHPUT_KEYS, *SPECCTL_KNOBS)
# Top-level keys of a deployment file: their presence means "this is not an SGLang adaptive JSON".
_DEPLOYMENT_KEYS = ("version", "speculative", "model", "roles", "serve", "cache", "transfer", "name")
_DIGITS = re.compile(r"[0-9]+")
_SIMPLE_KEY = re.compile(r"^[A-Za-z0-9_-]+$")

Mode = Literal["sglang", "deployment"]


@dataclass(frozen=True)
class Knobs:
    """The policy knobs of one bucket after merging (defaults < global knobs < bucket overrides)."""

    strategy: str = "ema"
    ema_alpha: float = 0.2
    update_interval: int = 5
    warmup_batches: int = 10
    down_hysteresis: float = -0.25
    up_hysteresis: float = 0.0
    ceiling_coeff: float = 0
    zero_backoff: int = 1  # specctl only (SPECCTL_KNOB_DEFAULTS); 1 = SGLang's behaviour
    zero_threshold: float | None = None  # specctl only; None = SGLang's 0.5 + down_hysteresis

    @property
    def specctl_only(self) -> tuple[str, ...]:
        """The specctl-only knobs set away from their defaults (what SGLang cannot run)."""
        return tuple(k for k, v in SPECCTL_KNOB_DEFAULTS.items() if getattr(self, k) != v)

    @property
    def sglang(self) -> Knobs:
        """These knobs with every specctl-only one at its default: what SGLang runs of them."""
        return replace(self, **SPECCTL_KNOB_DEFAULTS)

    @property
    def zero_bar(self) -> float:
        """The EMA at or below which the policy steps down to 0: zero_threshold, else SGLang's bar."""
        return 0.5 + self.down_hysteresis if self.zero_threshold is None else self.zero_threshold


@dataclass(frozen=True)
class Bucket:
    """One batch-size slot: batch sizes >= `min_batch_size` (up to the next bucket) choose among its steps.

    `candidate_steps` is sorted and de-duplicated, as SGLang uses it. `key` is the key as written and
    `path` the JSON path of the bucket in its file (for findings).
    """

    min_batch_size: int
    candidate_steps: tuple[int, ...]
    knobs: Knobs = field(default_factory=Knobs)
    key: str = ""
    path: str = ""

    @property
    def start_steps_default(self) -> int:
        """The step a slot starts at when the initial step is not one of its candidates."""
        return self.candidate_steps[len(self.candidate_steps) // 2]

    def start_steps(self, initial_steps: int) -> int:
        return initial_steps if initial_steps in self.candidate_steps else self.start_steps_default


def pad_batch_size(batch_size: int, graph_batch_sizes: Sequence[int]) -> int | None:
    """The graph batch size `batch_size` is padded up to: the smallest one >= it, None when none is."""
    graphs = sorted(set(graph_batch_sizes))
    i = bisect.bisect_left(graphs, batch_size)
    return graphs[i] if i < len(graphs) else None


@dataclass(frozen=True)
class AdaptiveConfig:
    """Buckets in ascending `min_batch_size` order (at least one) and the global strategy."""

    buckets: tuple[Bucket, ...]
    strategy: str = "ema"

    def __post_init__(self) -> None:
        # Internal invariant: parsers only build non-empty, sorted, unique-key configs.
        keys = [b.min_batch_size for b in self.buckets]
        assert keys and keys == sorted(set(keys)), keys

    @property
    def keys(self) -> tuple[int, ...]:
        return tuple(b.min_batch_size for b in self.buckets)

    def bucket(self, key: int) -> Bucket:
        return self.buckets[self.keys.index(key)]

    def route(self, batch_size: int, graph_batch_sizes: Sequence[int] = ()) -> Bucket:
        """SGLang's routing: pad up to the smallest graph batch size >= batch_size (if any), then take
        the bucket with the largest key <= that size, or the smallest bucket if none is."""
        padded = pad_batch_size(batch_size, graph_batch_sizes)
        size = batch_size if padded is None else padded
        i = bisect.bisect_right(self.keys, size) - 1
        return self.buckets[max(0, i)]

    @property
    def specctl_only(self) -> tuple[str, ...]:
        """specctl-only knobs any bucket sets away from their defaults (empty: SGLang runs it the same)."""
        return tuple(sorted({k for b in self.buckets for k in b.knobs.specctl_only}))

    @property
    def union_steps(self) -> tuple[int, ...]:
        return tuple(sorted({s for b in self.buckets for s in b.candidate_steps}))

    @property
    def default_initial_steps(self) -> int:
        """SGLang's `--speculative-num-steps` when not given: the middle of the union of candidates."""
        union = self.union_steps
        return union[len(union) // 2]


SGLANG_DEFAULT_CONFIG: dict[str, Any] = {
    "1": {"candidate_steps": [1, 3, 5, 7], "up_hysteresis": 0.0, "down_hysteresis": -0.25, "ceiling_coeff": 0},
    "8": {"candidate_steps": [0, 1, 3], "up_hysteresis": 0.0, "down_hysteresis": 0.0, "ceiling_coeff": 0},
    "32": {"candidate_steps": [0, 1], "up_hysteresis": 0.0, "down_hysteresis": 0.0, "ceiling_coeff": 0},
    "64": {"candidate_steps": [0], "up_hysteresis": 0.0, "down_hysteresis": 0.0, "ceiling_coeff": 0},
}


def _is_int(v: object) -> TypeGuard[int]:
    return isinstance(v, int) and not isinstance(v, bool)


def _is_number(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


def _show(v: Any) -> str:
    """A value as the user wrote it in JSON terms (true, null, "x")."""
    if v is True:
        return "true"
    if v is False:
        return "false"
    if v is None:
        return "null"
    if isinstance(v, str):
        return f'"{v}"'
    try:
        text = json.dumps(v, allow_nan=True)
    except (TypeError, ValueError):
        text = repr(v)
    return text if len(text) <= 60 else text[:57] + "..."
