"""What `specctl adaptive tune` returns and prints: `TuneResult` (its JSON form and `render_tune`'s text),
and the recommended config in the forms a user runs: SGLang's JSON (`sglang_json`), a deployment's
`speculative.adaptive` block (`deployment_adaptive`) and YAML snippet (`deployment_snippet`). Torch-free.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from specctl.adaptive.overhead import ServingOverhead
from specctl.adaptive.replay import Prediction
from specctl.adaptive.stats import RunBreakdown, ratio
from specctl.schemas.adaptive import (
    AdaptiveConfig,
    Bucket,
    StepCoverage,
)
from specctl.schemas.findings import Finding


@dataclass(frozen=True)
class SGLangChoice:
    """The best config SGLang can run, when the recommendation needs a specctl-only knob."""

    cfg: AdaptiveConfig
    initial_steps: int
    predicted: Prediction

    def to_json(self, none: Prediction) -> dict[str, Any]:
        return {"sglang_adaptive_config": sglang_json(self.cfg), "initial_steps": self.initial_steps,
                "predicted": self.predicted.to_json(),
                "speedup_vs_none": ratio(self.predicted, none)}



@dataclass(frozen=True)
class TuneResult:
    recommended: AdaptiveConfig
    initial_steps: int
    predicted: Prediction
    current: Prediction
    best_fixed_steps: int
    best_fixed: Prediction
    none: Prediction
    allowed_steps: tuple[int, ...]
    coverage: StepCoverage
    findings: tuple[Finding, ...]
    evaluated: int
    sglang: SGLangChoice | None = None  # set when `recommended` uses a specctl-only knob
    sglang_only: bool = False  # the search was restricted to what SGLang can run
    overhead: ServingOverhead | None = None  # serving overhead in the predictions (None: decode only)
    runs: tuple[RunBreakdown, ...] = ()  # each recorded run alone: the recommendation vs its best fixed step
    intervals: dict[str, tuple[float, float]] | None = None  # `speedup_intervals` (None: no positional facts)
    notes: tuple[str, ...] = ()  # what bounds the search and which replay the trace allowed (`trace_notes`)
    cost_model: str = ""  # `CostModel.provenance` of the model that priced it
    cost_estimated: bool = False

    @property
    def overhead_s_per_token(self) -> float | None:
        return self.overhead.per_token if self.overhead is not None else None

    def speedups(self) -> dict[str, float]:
        p = self.predicted
        return {"vs_current": ratio(p, self.current), "vs_best_fixed": ratio(p, self.best_fixed),
                "vs_none": ratio(p, self.none)}

    @property
    def specctl_only(self) -> tuple[str, ...]:
        """specctl-only knobs the recommendation uses (empty: SGLang runs it as is)."""
        return self.recommended.specctl_only

    def sglang_json(self) -> dict[str, Any] | None:
        """The recommendation as SGLang JSON; None when SGLang cannot express it (see `sglang`)."""
        return None if self.specctl_only else sglang_json(self.recommended)

    def deployment_snippet(self) -> str:
        return deployment_snippet(self.recommended, self.initial_steps)

    def deployment_adaptive(self) -> dict[str, Any]:
        return deployment_adaptive(self.recommended)

    def to_json(self) -> dict[str, Any]:
        rec: dict[str, Any] = {
            "sglang_adaptive_config": self.sglang_json(), "initial_steps": self.initial_steps,
            "deployment_snippet": self.deployment_snippet(), "deployment_adaptive": self.deployment_adaptive(),
            "specctl_only_knobs": list(self.specctl_only),
        }
        if self.specctl_only:
            rec["sglang_note"] = (
                f"SGLang cannot express {', '.join(self.specctl_only)} (its loader ignores the key): run this "
                "config with engine: builtin; the best config SGLang can run is under 'sglang'")
        return {
            "recommended": rec,
            "sglang": self.sglang.to_json(self.none) if self.sglang is not None else None,
            "search": {"sglang_only": self.sglang_only},
            "predicted": self.predicted.to_json(),
            "current": self.current.to_json(),
            "best_fixed": {"steps": self.best_fixed_steps, **self.best_fixed.to_json()},
            "none": self.none.to_json(),
            "speedup": self.speedups(),
            "speedup_ci95": {k: list(v) for k, v in self.intervals.items()} if self.intervals is not None else None,
            "allowed_steps": list(self.allowed_steps),
            "evaluated_configs": self.evaluated,
            "serving_overhead_s_per_token": self.overhead_s_per_token,
            "serving_overhead": self.overhead.to_json() if self.overhead is not None else None,
            "validation": {"coverage": self.coverage.to_json(), "findings": [f.to_json() for f in self.findings]},
            "runs": [r.to_json() for r in self.runs],
            "notes": list(self.notes),
            "cost_model": {"provenance": self.cost_model, "estimate": self.cost_estimated},
        }


_KNOB_FIELDS = ("ema_alpha", "update_interval", "warmup_batches", "down_hysteresis", "up_hysteresis",
                "ceiling_coeff")


def sglang_json(cfg: AdaptiveConfig) -> dict[str, Any]:
    """The config as SGLang's `--speculative-adaptive-config` JSON (every knob written in its bucket).

    Only SGLang's knobs: a config with a specctl-only knob set is refused (ValueError), never silently
    written without it (SGLang would run another policy)."""
    if cfg.specctl_only:
        raise ValueError(f"SGLang cannot express {', '.join(cfg.specctl_only)}; use deployment_adaptive(cfg)")
    out: dict[str, Any] = {}
    for b in cfg.buckets:
        entry: dict[str, Any] = {"candidate_steps": list(b.candidate_steps)}
        for name in _KNOB_FIELDS:
            entry[name] = getattr(b.knobs, name)
        out[str(b.min_batch_size)] = entry
    return out


def _bucket_knobs(b: Bucket) -> dict[str, Any]:
    """A bucket's knobs as written in a deployment: SGLang's all, specctl-only ones where set."""
    return {**{n: getattr(b.knobs, n) for n in _KNOB_FIELDS}, **{n: getattr(b.knobs, n) for n in b.knobs.specctl_only}}


def deployment_adaptive(cfg: AdaptiveConfig) -> dict[str, Any]:
    """The config as a deployment's `speculative.adaptive` block (a dict; specctl-only knobs included)."""
    return {"strategy": "ema", "buckets": {str(b.min_batch_size): {"candidate_steps": list(b.candidate_steps),
                                                                   **_bucket_knobs(b)} for b in cfg.buckets}}


def deployment_snippet(cfg: AdaptiveConfig, initial_steps: int) -> str:
    """The same config as a deployment file's `speculative` block (YAML)."""
    lines = ["speculative:", f"  num_steps: {initial_steps}", "  adaptive:", "    strategy: ema", "    buckets:"]
    for b in cfg.buckets:
        knobs = ", ".join(f"{n}: {v}" for n, v in _bucket_knobs(b).items())
        steps = ", ".join(map(str, b.candidate_steps))
        lines.append(f"      {b.min_batch_size}: {{candidate_steps: [{steps}], {knobs}}}")
    return "\n".join(lines) + "\n"


RUNS_SHOWN = 12


def _render_runs(runs: Sequence[Any]) -> list[str]:
    """Each recorded run alone (the ones the recommendation serves worst first): one config serves them all."""
    if len(runs) < 2:
        return []
    lines = ["per recorded run (one engine each), the recommendation vs the fixed step best for that run alone:"]
    for r in sorted(runs, key=lambda r: r.vs_best_fixed)[:RUNS_SHOWN]:
        lines.append(f"  run {r.run or '-'}  batch <= {r.max_batch_size:<3d} {r.verifies:6d} verifies  "
                     f"{r.recommended.tokens_per_s:10.1f} tok/s  best fixed {r.best_fixed_steps}: "
                     f"{r.best_fixed.tokens_per_s:10.1f} tok/s  ({r.vs_best_fixed:.2f}x)")
    if len(runs) > RUNS_SHOWN:
        lines.append(f"  ... {len(runs) - RUNS_SHOWN} more runs in --format json (runs)")
    return lines


def render_tune(result: TuneResult) -> str:
    sp = result.speedups()
    sglang_json = result.sglang_json()
    lines: list[str] = []
    if sglang_json is not None:
        lines += ["recommended adaptive config (SGLang --speculative-adaptive-config JSON):",
                  json.dumps(sglang_json, indent=2), "",
                  f"as a deployment snippet (initial steps {result.initial_steps}):"]
    else:
        knobs = ", ".join(result.specctl_only)
        lines += [f"recommended adaptive config: a specctl deployment (engine: builtin), initial steps "
                  f"{result.initial_steps}; it uses {knobs}, which SGLang cannot express (its loader ignores the key):"]
    lines += [result.deployment_snippet().rstrip(), "", "predicted on the trace (tokens/s under the cost model):"]
    rows = [("recommended", result.predicted), ("current", result.current),
            (f"best fixed (steps {result.best_fixed_steps})", result.best_fixed), ("no speculation", result.none)]
    if result.sglang is not None:
        rows.insert(1, ("best SGLang can run", result.sglang.predicted))
    width = max(len(n) for n, _ in rows)
    for name, p in rows:
        used = ", ".join(f"{k}: {v}" for k, v in sorted(p.batches_per_steps.items()))
        lines.append(f"  {name.ljust(width)}  {p.tokens_per_s:10.1f} tok/s   batches per steps {{{used}}}")
    ci = result.intervals or {}

    def band(key: str) -> str:
        return f" [{ci[key][0]:.2f}, {ci[key][1]:.2f}]" if key in ci else ""

    lines.append(f"speed-up: {sp['vs_current']:.2f}x current, {sp['vs_best_fixed']:.2f}x best fixed"
                 f"{band('vs_best_fixed')}, {sp['vs_none']:.2f}x no speculation{band('vs_none')}"
                 + (" (95% intervals over resamples of the trace's requests)" if ci else ""))
    if ci:
        flo, fhi = ci["vs_best_fixed"]
        if flo < 1.0 < fhi:
            lines.append(f"(the trace cannot tell the recommendation from fixed steps {result.best_fixed_steps}: "
                         "either may serve this traffic better; a longer trace narrows the interval)")
    if result.overhead is not None and result.overhead.source == "requests":
        lines.append(f"(includes the time the requests waited for their first token (prefill, transfer, "
                     f"queueing), which no config shortens: {result.overhead.per_token * 1e3:.3f} ms per token; "
                     "the decode itself is priced at profiled speed: a trace of per-request histograms has no "
                     "verify timings to measure the serving loop's turn; --decode-only leaves it out)")
    elif result.overhead is not None:
        o = result.overhead
        settled = f"those no request joined {o.settled_scale:.2f}x; " if o.settled_scale is not None else ""
        join = (f", the draft's pass over a joining request's prompt ({o.join_draft_s * 1e3:.2f} ms a join, at "
                "steps > 0 only: plain decoding never runs it)" if o.join_draft_s > 0 else "")
        lines.append(f"(includes the serving time the trace measured beyond the cost model: verifies at "
                     f"{o.scale:.2f}x their profiled price ({settled}{o.excess * 1e3:+.3f} ms per token){join}, the "
                     f"serving loop's turn between verifies at {o.turn * 100:.0f}% of a verify's time, and "
                     f"{o.per_token * 1e3:.3f} ms per token more where requests joined; every config is priced "
                     "at the settled verifies' speed with the pass, its decode time scaled by the turn, and pays "
                     "the last per token; --decode-only leaves them out)")
    else:
        lines.append("(decode only: --decode-only, or the trace has no verify timings to measure serving time)")
    lines += _render_runs(result.runs)
    lines += [f"({note})" for note in result.notes]
    lines.append(f"(cost model: {result.cost_model})")
    searched = f"steps searched: {', '.join(map(str, result.allowed_steps))}; {result.evaluated} configs replayed"
    if result.sglang_only:
        searched += "; only what SGLang can run (--sglang or engine: sglang)"
    lines.append(f"({searched})")
    if result.sglang is not None:
        s = result.sglang.to_json(result.none)
        lines += ["", f"for SGLang (which cannot run {', '.join(result.specctl_only)}), the best config it can run, "
                  f"initial steps {s['initial_steps']}, predicted {s['speedup_vs_none']:.2f}x no speculation "
                  "(`--sglang` searches only these):", json.dumps(s["sglang_adaptive_config"], indent=2)]
    lines.append("")
    lines.append("validation of the recommendation (specctl validate's step coverage):")
    lines.append(result.coverage.render_text())
    errors = [f for f in result.findings if f.severity == "error"]
    for f in result.findings:
        if f.severity != "info":
            lines.append(f"  {f.code} {f.path}: {f.severity}: {f.message}")
    lines.append("valid: no error findings" if not errors else f"INVALID: {len(errors)} error finding(s)")
    lines.append("confirm with: specctl bench -c DEPLOY --ab speculative.adaptive=... (see `specctl bench --help`)")
    return "\n".join(lines) + "\n"

