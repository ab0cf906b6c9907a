"""Adaptive speculative steps: the config model, batch-size routing, bucket sanity and step coverage.

One model serves both inputs: SGLang's own `--speculative-adaptive-config` JSON (integer-string keys
are batch-size buckets, every other top-level key is a global knob merged under each bucket, the bucket
winning) and the `speculative.adaptive` block of a deployment file (knobs plus a `buckets` mapping).
Parsing never raises on bad content: it returns the config SGLang would run (or None when nothing
usable is left) plus every `Finding`, ADP2xx for bucket sanity. `step_coverage` proves step coverage:
which steps the runtime can select at each reachable (padded) batch size, hence which runtime states
must be prebuilt, with ADP1xx findings. The EMA policy that walks these buckets lives in
`specctl.adaptive.policy`. Torch-free: `specctl validate` imports this module.

Layout: this module is the stable import point and re-exports the public names of its parts, one noun
each: `adaptive_config` (the config model, routing, SGLang's defaults), `adaptive_parser` (both input
dialects -> config + ADP2xx), `adaptive_coverage` (step coverage, ADP1xx) and `adaptive_rules` (the
ADP rule catalog for `specctl explain`).
"""

from __future__ import annotations

import specctl.schemas.adaptive_rules  # noqa: F401 - registers the ADP codes (specctl explain)
from specctl.schemas.adaptive_config import (
    EMA_KNOBS,
    KNOB_DEFAULTS,
    SGLANG_DEFAULT_CONFIG,
    SPECCTL_KNOB_DEFAULTS,
    SPECCTL_KNOBS,
    STRATEGIES,
    THROUGHPUT_KEYS,
    AdaptiveConfig,
    Bucket,
    Knobs,
    Mode,
    pad_batch_size,
)
from specctl.schemas.adaptive_coverage import CoverageRow, StepCoverage, check_deployment_steps, step_coverage
from specctl.schemas.adaptive_parser import (
    child_path,
    looks_like_sglang_adaptive,
    parse_deployment_adaptive,
    parse_sglang_config,
    sglang_default_config,
)

__all__ = [
    "EMA_KNOBS", "KNOB_DEFAULTS", "SGLANG_DEFAULT_CONFIG", "SPECCTL_KNOBS", "SPECCTL_KNOB_DEFAULTS", "STRATEGIES",
    "THROUGHPUT_KEYS", "AdaptiveConfig", "Bucket",
    "CoverageRow", "Knobs", "Mode", "StepCoverage", "check_deployment_steps", "child_path",
    "looks_like_sglang_adaptive", "pad_batch_size", "parse_deployment_adaptive", "parse_sglang_config",
    "sglang_default_config", "step_coverage",
]
