"""Adaptive speculative steps, step coverage (ADP1xx): which steps the runtime can select
at each reachable (padded) batch size, hence which runtime states must be prebuilt.
(Split out of `schemas/adaptive.py`, which re-exports everything.)
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from specctl.schemas.adaptive_config import (
    SPECCTL_KNOB_DEFAULTS,
    SPECCTL_KNOB_UNDER_SGLANG,
    AdaptiveConfig,
    Mode,
    _is_int,
)
from specctl.schemas.adaptive_parser import child_path, parse_deployment_adaptive, specctl_only_settings
from specctl.schemas.findings import Finding

# --------------------------------------------------------------------------------------------------
# Step coverage (ADP1xx)
# --------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class CoverageRow:
    """Batch sizes `batch_min..batch_max` (None: unbounded) pad to `padded_size` (None: no graph size is
    large enough, so they run unpadded) and route to `bucket` (None: fixed steps, no adaptive), where
    `steps` are selectable and a slot starts at `start_steps`."""

    batch_min: int
    batch_max: int | None
    padded_size: int | None
    bucket: int | None
    steps: tuple[int, ...]
    start_steps: int

    def to_json(self) -> dict[str, Any]:
        return {
            "batch_min": self.batch_min,
            "batch_max": self.batch_max,
            "padded_size": self.padded_size,
            "bucket": self.bucket,
            "steps": list(self.steps),
            "start_steps": self.start_steps,
        }


@dataclass(frozen=True)
class StepCoverage:
    """The reachable (batch size -> steps) table and the runtime states that must be prebuilt."""

    rows: tuple[CoverageRow, ...]
    required_states: tuple[int, ...]
    initial_steps: int
    # step -> the graph batch sizes at which it is selectable (SGLang captures graphs only there).
    graphs_by_step: tuple[tuple[int, tuple[int, ...]], ...] = ()
    unreachable_buckets: tuple[int, ...] = ()
    adaptive: bool = True

    def to_json(self) -> dict[str, Any]:
        return {
            "adaptive": self.adaptive,
            "initial_steps": self.initial_steps,
            "required_states": list(self.required_states),
            "graphs_by_step": {str(s): list(g) for s, g in self.graphs_by_step},
            "unreachable_buckets": list(self.unreachable_buckets),
            "rows": [r.to_json() for r in self.rows],
        }

    def render_text(self) -> str:
        head = ("batch size", "padded to", "bucket", "selectable steps", "starts at")
        body = []
        for r in self.rows:
            if r.batch_max is None:
                size = f"{r.batch_min}+"
            elif r.batch_max == r.batch_min:
                size = str(r.batch_min)
            else:
                size = f"{r.batch_min}-{r.batch_max}"
            padded = "-" if r.padded_size is None else str(r.padded_size)
            bucket = "fixed" if r.bucket is None else str(r.bucket)
            body.append((size, padded, bucket, ", ".join(map(str, r.steps)), str(r.start_steps)))
        widths = [max(len(row[i]) for row in (head, *body)) for i in range(len(head))]
        lines = ["  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip() for row in (head, *body)]
        lines.append(
            f"prebuilt runtime states (steps): {', '.join(map(str, self.required_states))}; "
            f"initial steps: {self.initial_steps}"
        )
        if self.unreachable_buckets:
            lines.append(f"unreachable buckets: {', '.join(map(str, self.unreachable_buckets))}")
        return "\n".join(lines)


def _segments(
    graphs: Sequence[int], keys: Sequence[int], max_batch_size: int | None
) -> list[tuple[int, int | None, int | None]]:
    """Batch-size ranges with one (padded size, bucket) each: (lo, hi or None, padded or None)."""
    segs: list[tuple[int, int | None, int | None]] = []
    lo = 1
    for g in sorted(set(graphs)):
        if g >= lo:
            segs.append((lo, g, g))
            lo = g + 1
    # Beyond the largest graph size batches run unpadded: split where a bucket starts.
    for k in sorted(set(keys)):
        if k > lo:
            segs.append((lo, k - 1, None))
            lo = k
    segs.append((lo, None, None))
    if max_batch_size is None:
        return segs
    out: list[tuple[int, int | None, int | None]] = []
    for lo, hi, padded in segs:
        if lo > max_batch_size:
            break
        out.append((lo, max_batch_size if hi is None or hi > max_batch_size else hi, padded))
    return out


def _clean_graphs(graph_batch_sizes: Sequence[int] | None) -> list[int]:
    # Malformed graph sizes are the deployment schema's to report; coverage uses the valid ones.
    return sorted({g for g in (graph_batch_sizes or ()) if _is_int(g) and g >= 1})


def _fixed_coverage(steps: int, graphs: Sequence[int], max_batch_size: int | None) -> StepCoverage:
    rows = tuple(
        CoverageRow(lo, hi, padded, None, (steps,), steps) for lo, hi, padded in _segments(graphs, (), max_batch_size)
    )
    used = tuple(sorted({r.padded_size for r in rows if r.padded_size is not None}))
    return StepCoverage(rows, (steps,), steps, ((steps, used),), (), adaptive=False)


def step_coverage(
    cfg: AdaptiveConfig,
    *,
    initial_steps: int | None,
    graph_batch_sizes: Sequence[int] = (),
    max_batch_size: int | None = None,
    base_path: str = "$",
    initial_steps_path: str | None = None,
    source: Mode = "sglang",
) -> tuple[StepCoverage, list[Finding]]:
    """Which steps the runtime can select, at which batch sizes, and the states to prebuild (rule 1).

    `base_path` is the path of the adaptive section (bucket paths come from the buckets themselves);
    `initial_steps_path` where the initial step is written (`$.speculative.num_steps`; defaults to
    `base_path` for SGLang files, whose initial step is a command-line flag). `source` names the
    settings in messages the way that input spells them (SGLang flags or deployment fields).
    """
    findings: list[Finding] = []
    if source == "sglang":
        init_name, graphs_name, max_bs_name = "--speculative-num-steps", "--cuda-graph-bs", "--max-running-requests"
    else:
        init_name, graphs_name, max_bs_name = "speculative.num_steps", "serve.graph_batch_sizes", "serve.max_batch_size"
    init_path = initial_steps_path or base_path
    union = cfg.union_steps
    if initial_steps is None:
        initial_steps = cfg.default_initial_steps
        findings.append(Finding(
            "ADP105", "info", init_path,
            f"no {init_name} given; SGLang starts at the middle of the candidate union {list(union)}: "
            f"{initial_steps}",
            (f"pass --initial-steps N (SGLang's {init_name}), N one of {list(union)}" if source == "sglang"
             else f"set {init_name} to one of {list(union)}"),
        ))
    graphs = _clean_graphs(graph_batch_sizes)
    if max_batch_size is not None and (not _is_int(max_batch_size) or max_batch_size < 1):
        max_batch_size = None
    rows: list[CoverageRow] = []
    for lo, hi, padded in _segments(graphs, cfg.keys, max_batch_size):
        b = cfg.route(lo, graphs)
        rows.append(CoverageRow(lo, hi, padded, b.min_batch_size, b.candidate_steps, b.start_steps(initial_steps)))
    reachable = {r.bucket for r in rows}
    unreachable = tuple(k for k in cfg.keys if k not in reachable)
    selectable = {initial_steps} | {s for b in cfg.buckets if b.min_batch_size in reachable for s in b.candidate_steps}
    graph_rows = [(r.padded_size, r.steps) for r in rows if r.padded_size is not None]
    graphs_by_step = tuple(
        (s, tuple(padded for padded, steps in graph_rows if s in steps)) for s in sorted(selectable)
    )

    if initial_steps not in union:
        first = cfg.route(1, graphs)
        findings.append(Finding(
            "ADP101", "error", init_path,
            f"{init_name}={initial_steps} is not in the adaptive config candidate_steps {list(union)} "
            f"(SGLang refuses to start; an unbuilt step fails with 'Missing adaptive runtime state for "
            f"steps={initial_steps}')",
            f"set {init_name} to one of {list(union)} (SGLang's default is {cfg.default_initial_steps}), "
            f'or add {initial_steps} to candidate_steps of bucket "{first.key}"',
        ))
    for b in cfg.buckets:
        if b.min_batch_size in reachable:
            continue
        only_here = sorted(set(b.candidate_steps) - selectable)
        lost = (
            f"; steps {only_here} are selectable nowhere else, so their runtime states (SGLang prebuilds one per "
            "candidate) are never used"
            if only_here else ""
        )
        if max_batch_size is not None and b.min_batch_size > max_batch_size:
            findings.append(Finding(
                "ADP102", "warning", b.path,
                f'bucket "{b.key}" is unreachable: {max_bs_name} is {max_batch_size}, below its lower '
                f"bound {b.min_batch_size}{lost}",
                f'remove bucket "{b.key}", or raise {max_bs_name} to at least {b.min_batch_size}',
            ))
            continue
        nxt = [k for k in cfg.keys if k > b.min_batch_size]
        upper = nxt[0] - 1 if nxt else None
        pads = sorted({r.padded_size for r in rows if r.padded_size is not None
                       and r.batch_max is not None and r.batch_max >= b.min_batch_size
                       and (upper is None or r.batch_min <= upper)})
        span = f"{b.min_batch_size}..{upper}" if upper is not None else f"{b.min_batch_size} and above"
        if pads:
            why = (
                f"batch sizes {span} pad to graph size(s) {pads} of {graphs_name} {graphs}, "
                "which route to other buckets"
            )
            fix = f'add {b.min_batch_size} to {graphs_name} (any size in {span} works), or remove bucket "{b.key}"'
        else:
            why = "no batch size routes to it (a smaller key catches every size below the next bucket)"
            fix = f'remove bucket "{b.key}"'
        findings.append(Finding(
            "ADP103", "warning", b.path, f'bucket "{b.key}" is unreachable: {why}{lost}', fix,
        ))
    coverage = StepCoverage(
        rows=tuple(rows),
        required_states=tuple(sorted(selectable)),
        initial_steps=initial_steps,
        graphs_by_step=graphs_by_step,
        unreachable_buckets=unreachable,
        adaptive=True,
    )
    return coverage, findings


def engine_findings(adaptive: Any, engine: str, apath: str) -> list[Finding]:
    """ADP221: specctl-only knobs (zero_backoff, zero_threshold) set in a deployment whose engine is sglang. Its servers
    read the exported SGLang adaptive JSON, whose loader never reads them, so the deployment would run
    another policy than it says. Reported where each value sits under the adaptive block at `apath`."""
    if engine != "sglang":
        return []
    out: list[Finding] = []
    for keys, knob, value in specctl_only_settings(adaptive):
        path = apath
        for k in (*keys, knob):
            path = child_path(path, k)
        where = f'bucket "{keys[1]}" sets {knob}' if keys else f"speculative.adaptive.{knob} is"
        out.append(Finding(
            "ADP221", "error", path,
            f"{where} {value}, a specctl-only knob, but engine: sglang runs SGLang servers: their adaptive JSON "
            f"cannot carry {knob} (SGLang ignores the key: {SPECCTL_KNOB_UNDER_SGLANG[knob]}), so the "
            "deployment would not run the policy it describes",
            f"remove {knob}{_or_default(knob)}, or set engine: builtin; "
            "`specctl adaptive tune --sglang` finds the best config SGLang can run",
        ))
    return out


def check_deployment_steps(
    role: Mapping[str, Any],
    *,
    base_path: str = "$",
    adaptive_path: str | None = None,
    num_steps_path: str | None = None,
    engine: str = "builtin",
) -> tuple[StepCoverage | None, list[Finding]]:
    """Rules 1 and 2 for one merged role dict (`merge_role`, `RoleConfig.to_json()`): bucket sanity findings of its
    `speculative.adaptive` block plus step coverage. Without `adaptive` the coverage is the fixed
    `num_steps` (0 for `algorithm: none`). Returns (None, findings) when no coverage can be computed.
    `engine` is the deployment's (`builtin` | `sglang`): with sglang, specctl-only knobs are ADP221 errors.

    Paths default to `{base_path}.speculative.adaptive` / `.num_steps`; pass `adaptive_path` and
    `num_steps_path` where a role override wrote them (`$.roles.decode.speculative.adaptive`)."""
    spec = role.get("speculative") if isinstance(role.get("speculative"), Mapping) else {}
    serve = role.get("serve") if isinstance(role.get("serve"), Mapping) else {}
    assert isinstance(spec, Mapping) and isinstance(serve, Mapping)
    raw_graphs = serve.get("graph_batch_sizes")
    graphs = _clean_graphs(raw_graphs if isinstance(raw_graphs, list) else ())
    max_bs = serve.get("max_batch_size")
    max_bs = max_bs if _is_int(max_bs) and max_bs >= 1 else None
    num_steps = spec.get("num_steps")
    num_steps = num_steps if _is_int(num_steps) and num_steps >= 0 else None
    if spec.get("algorithm", "none") in (None, "none"):
        return _fixed_coverage(0, graphs, max_bs), []
    adaptive = spec.get("adaptive")
    if adaptive is None:
        if num_steps is None:
            return None, []  # the schema reports the missing/invalid num_steps
        return _fixed_coverage(num_steps, graphs, max_bs), []
    apath = adaptive_path or f"{base_path}.speculative.adaptive"
    cfg, findings = parse_deployment_adaptive(adaptive, base_path=apath)
    findings += engine_findings(adaptive, engine, apath)
    if cfg is None:
        return None, findings
    coverage, more = step_coverage(
        cfg,
        initial_steps=num_steps,
        graph_batch_sizes=graphs,
        max_batch_size=max_bs,
        base_path=apath,
        initial_steps_path=num_steps_path or f"{base_path}.speculative.num_steps",
        source="deployment",
    )
    return coverage, findings + more


def _or_default(knob: str) -> str:
    """' (or set it to D, SGLang's behaviour)' for a knob whose default can be written, else ''."""
    default = SPECCTL_KNOB_DEFAULTS[knob]
    return "" if default is None else f" (or set it to {default}, SGLang's behaviour)"
