"""The adaptive config a tool replays: an SGLang `--speculative-adaptive-config` JSON, or a deployment file /
preset (its decode or colocated role's `speculative.adaptive`), read with its findings (`load_setup`).
Torch-free."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path

from specctl.errors import InvalidInput, UsageError
from specctl.schemas.adaptive import (
    AdaptiveConfig,
    StepCoverage,
    looks_like_sglang_adaptive,
    parse_deployment_adaptive,
    parse_sglang_config,
    step_coverage,
)
from specctl.schemas.deployment import override_path
from specctl.schemas.findings import Finding
from specctl.schemas.loader import Document, load_document
from specctl.schemas.validator import load_deployment


@dataclass(frozen=True)
class SimulationSetup:
    """What to replay: the config, the initial steps and graph sizes in force, and its findings."""

    source: str
    kind: str  # "sglang" | "deployment"
    cfg: AdaptiveConfig
    initial_steps: int
    graph_batch_sizes: tuple[int, ...]
    coverage: StepCoverage
    findings: tuple[Finding, ...]  # warnings and infos (errors raise)
    engine: str | None = None  # a deployment's `engine` (builtin | sglang); None for an SGLang JSON



def _with_positions(findings: Sequence[Finding], doc: Document) -> list[Finding]:
    out = []
    for f in findings:
        pos = doc.position(f.path) if f.line is None else None
        out.append(replace(f, line=pos[0], column=pos[1]) if pos else f)
    return out


def load_setup(
    config: str,
    *,
    initial_steps: int | None = None,
    graph_batch_sizes: Sequence[int] | None = None,
    overrides: Sequence[str] = (),
) -> SimulationSetup:
    """Read CONFIG (SGLang JSON, deployment file or preset) into what the simulator replays.

    Raises UsageError (unreadable, nothing adaptive to simulate) or InvalidInput whose `.findings`
    are the error findings (with line numbers)."""
    path = Path(config)
    doc = load_document(path) if path.exists() else None
    if doc is not None and looks_like_sglang_adaptive(doc.data):
        if overrides:
            raise UsageError("--set applies to deployment files, not to an SGLang adaptive JSON")
        kind = "sglang"
        engine = None
        cfg, findings = parse_sglang_config(doc.data)
        graphs = tuple(graph_batch_sizes or ())
        max_bs = None
        init_path, base = "$", "$"
    else:
        kind = "deployment"
        dep = load_deployment(config, overrides=overrides)
        engine = dep.engine
        role_name = next((r for r in ("decode", "colocated") if r in dep.roles), None)
        if role_name is None:
            raise UsageError(
                f"{config}: no decode or colocated role (roles: {', '.join(dep.roles)}); nothing decodes here",
            )
        role = dep.role(role_name)
        spec, serve = role.speculative, role.serve
        if not spec.adaptive or spec.algorithm == "none":
            raise UsageError(
                f"{config}: the {role_name} role has no adaptive steps (algorithm {spec.algorithm}, "
                f"fixed num_steps {spec.num_steps}); nothing to simulate",
                hint="add speculative.adaptive with buckets, or pass an SGLang adaptive JSON",
            )
        base = override_path(dep.raw, role_name, "speculative", "adaptive")
        init_path = override_path(dep.raw, role_name, "speculative", "num_steps")
        cfg, findings = parse_deployment_adaptive(spec.adaptive, base_path=base)
        if initial_steps is None:
            initial_steps = spec.num_steps
        graphs = serve.graph_batch_sizes if graph_batch_sizes is None else tuple(graph_batch_sizes)
        max_bs = serve.max_batch_size
        if doc is None:
            doc = load_document(dep.path) if dep.path else None
    coverage = None
    if cfg is not None:
        coverage, more = step_coverage(
            cfg, initial_steps=initial_steps, graph_batch_sizes=graphs, max_batch_size=max_bs,
            base_path=base, initial_steps_path=init_path,
        )
        findings = findings + more
    if doc is not None:
        findings = _with_positions(findings, doc)
    errors = [f for f in findings if f.severity == "error"]
    if errors or cfg is None or coverage is None:
        first = errors[0] if errors else None
        exc = InvalidInput(
            f"{config}: {len(errors)} error finding(s); the policy cannot run this config"
            + (f" (first: {first.code} {first.path})" if first else ""),
            hint=f"run `specctl validate {config}` for every finding",
        )
        exc.findings = errors  # type: ignore[attr-defined]
        raise exc
    if cfg.strategy != "ema":
        raise UsageError(
            f"{config}: strategy {cfg.strategy!r} cannot be simulated; specctl replays only the 'ema' policy "
            "(throughput_aware decides from SGLang's start-up cost profiling)",
            hint='set "strategy": "ema" to replay this trace with the EMA policy',
        )
    return SimulationSetup(
        source=str(config),
        kind=kind,
        cfg=cfg,
        initial_steps=coverage.initial_steps,
        graph_batch_sizes=tuple(sorted(set(graphs))),
        coverage=coverage,
        findings=tuple(findings),
        engine=engine,
    )

