"""Adaptive settings the deployment's engine cannot run (ADP221, documented in `adaptive_rules`).

specctl-only policy knobs (`SPECCTL_KNOBS`, e.g. `zero_backoff`) work with the builtin engine; with
`engine: sglang` the servers read the exported SGLang adaptive JSON, whose loader never reads them, so a
deployment carrying one would run a different policy than it says. Reported where each value is written
(top-level or role override, global knob or bucket), only when it differs from the SGLang behaviour.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from specctl.schemas.adaptive_config import SPECCTL_KNOB_DEFAULTS
from specctl.schemas.adaptive_parser import child_path
from specctl.schemas.findings import Finding
from specctl.schemas.rules import RuleContext, finding


def specctl_only_settings(adaptive: Any) -> list[tuple[tuple[str, ...], str, Any]]:
    """(keys under speculative.adaptive, knob, value) of every specctl-only knob set away from its default."""
    if not isinstance(adaptive, Mapping):
        return []
    out: list[tuple[tuple[str, ...], str, Any]] = []
    for knob, default in SPECCTL_KNOB_DEFAULTS.items():
        if knob in adaptive and adaptive[knob] != default:
            out.append(((), knob, adaptive[knob]))
    buckets = adaptive.get("buckets")
    if isinstance(buckets, Mapping):
        for key, entry in buckets.items():
            if not isinstance(entry, Mapping):
                continue
            for knob, default in SPECCTL_KNOB_DEFAULTS.items():
                if knob in entry and entry[knob] != default:
                    out.append((("buckets", str(key)), knob, entry[knob]))
    return out


def check(ctx: RuleContext) -> list[Finding]:
    if ctx.data.get("engine") != "sglang":
        return []
    out: list[Finding] = []
    for role, cfg in ctx.engine_roles("speculative"):
        spec = cfg["speculative"]
        if spec.get("algorithm", "none") == "none":
            continue  # FBK404 says the adaptive block is ignored
        for keys, knob, value in specctl_only_settings(spec.get("adaptive")):
            if keys:
                path = child_path(child_path(ctx.path(role, "speculative", "adaptive", "buckets"), keys[1]), knob)
                where = f'bucket "{keys[1]}" sets {knob}'
            else:
                path = ctx.path(role, "speculative", "adaptive", knob)
                where = f"speculative.adaptive.{knob}"
            out.append(finding(
                "ADP221", "error", path,
                f"[{role}] {where} {value}, a specctl-only knob, but engine: sglang runs SGLang servers: their "
                f"adaptive JSON cannot carry {knob} (SGLang ignores the key and probes from steps 0 at every "
                "decision), so the deployment would not run the policy it describes",
                f"remove {knob} (or set it to {SPECCTL_KNOB_DEFAULTS[knob]}, SGLang's behaviour), or set "
                "engine: builtin; `specctl adaptive tune --sglang` finds the best config SGLang can run",
            ))
    return out
