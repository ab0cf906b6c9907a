"""`specctl adaptive simulate`: replay recorded verify results through the adaptive-steps policy.

CONFIG is an SGLang `--speculative-adaptive-config` JSON, or a deployment file / preset (its decode
or colocated role's `speculative.adaptive`). TRACE is JSON Lines, one verify per line:
`{"batch_size": 4, "accepted": [2, 3, 0, 1]}` (accepted draft tokens per request; other keys are
ignored, blank lines skipped). The policy is the engine's own (`specctl.engine.adaptive`), so what
this prints is what the engine would do. `--format json` prints one object per trace record:
`{"index", "batch_size", "steps", "ema", "switched"}`: the 0-based record number (blank lines are
skipped), then the routed bucket's steps and EMA after that update and whether it switched. Text
prints a table and a summary (switches, batches run at each step).

Exit codes: 0 ok; 1 the config has error findings (printed on stderr, like `validate`); 2 unreadable
config or trace (a bad trace line is named by its line number). Torch-free.
"""

from __future__ import annotations

import json
import math
import sys
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any, Optional

import typer

from specctl.cli.common import OutputFormat, handle_errors
from specctl.cli.main import app
from specctl.cli.options import SetOption
from specctl.errors import InvalidInput, UsageError
from specctl.schemas.adaptive import AdaptiveConfig, StepCoverage
from specctl.schemas.findings import Finding

adaptive_app = typer.Typer(
    help="Adaptive speculative steps: replay traces through the step policy offline.", no_args_is_help=True
)
app.add_typer(adaptive_app, name="adaptive")

MAX_TRACE_LINE = 1 << 20  # one verify record; a longer line is not one


@dataclass(frozen=True)
class TraceRecord:
    """One verify result: the batch size and the accepted draft tokens of each request."""

    line: int
    batch_size: int
    accepted: tuple[int, ...]


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


@dataclass(frozen=True)
class SimStep:
    """The policy's state after one trace record."""

    index: int
    batch_size: int
    bucket: int
    ran_steps: int  # the steps this batch was verified with (before the update)
    steps: int  # the routed bucket's steps after the update
    ema: float
    switched: bool
    mean_accepted: float | None  # None for an empty batch

    def to_json(self) -> dict[str, Any]:
        return {
            "index": self.index,
            "batch_size": self.batch_size,
            "steps": self.steps,
            "ema": self.ema,
            "switched": self.switched,
        }


def _bad_line(path: str, line: int, what: str) -> UsageError:
    return UsageError(
        f"{path}:{line}: {what}",
        hint='each trace line is one JSON object such as {"batch_size": 4, "accepted": [2, 3, 0, 1]}',
    )


def read_trace(path: str | Path) -> list[TraceRecord]:
    """Parse a JSONL trace; UsageError naming the file and line for anything malformed."""
    name = str(path)
    try:
        with open(path, "rb") as fh:
            raw_lines = fh.read().split(b"\n")
    except IsADirectoryError:
        raise UsageError(f"{name}: is a directory, not a trace file") from None
    except OSError as exc:
        raise UsageError(f"{name}: cannot read trace: {exc.strerror or exc}") from None
    records: list[TraceRecord] = []
    for lineno, raw in enumerate(raw_lines, start=1):
        if len(raw) > MAX_TRACE_LINE:
            raise _bad_line(name, lineno, f"line longer than {MAX_TRACE_LINE} bytes")
        try:
            text = raw.decode("utf-8").strip()
        except UnicodeDecodeError:
            raise _bad_line(name, lineno, "not UTF-8 text") from None
        if not text:
            continue
        try:
            obj = json.loads(text, parse_constant=lambda c: float("nan"))
        except (ValueError, RecursionError) as exc:
            raise _bad_line(name, lineno, f"not valid JSON ({str(exc).split(':')[0]})") from None
        if not isinstance(obj, dict):
            raise _bad_line(name, lineno, f"expected a JSON object, got {type(obj).__name__}")
        bs = obj.get("batch_size")
        if not isinstance(bs, int) or isinstance(bs, bool) or bs < 1:
            raise _bad_line(name, lineno, f"batch_size must be a positive integer, got {json.dumps(bs)}")
        acc = obj.get("accepted")
        if not isinstance(acc, list):
            raise _bad_line(name, lineno, f"accepted must be a list of non-negative integers, got {json.dumps(acc)}")
        for i, a in enumerate(acc):
            if not isinstance(a, int) or isinstance(a, bool) or a < 0:
                shown = json.dumps(a) if not (isinstance(a, float) and not math.isfinite(a)) else str(a)
                raise _bad_line(name, lineno, f"accepted[{i}] must be a non-negative integer, got {shown}")
        records.append(TraceRecord(lineno, bs, tuple(acc)))
    return records


def _with_positions(findings: Sequence[Finding], doc: Any) -> list[Finding]:
    from dataclasses import replace

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
    from specctl.schemas.adaptive import (
        looks_like_sglang_adaptive,
        parse_deployment_adaptive,
        parse_sglang_config,
        step_coverage,
    )
    from specctl.schemas.loader import load_document

    path = Path(config)
    doc = load_document(path) if path.exists() else None
    if doc is not None and looks_like_sglang_adaptive(doc.data):
        if overrides:
            raise UsageError("--set applies to deployment files, not to an SGLang adaptive JSON")
        kind = "sglang"
        cfg, findings = parse_sglang_config(doc.data)
        graphs = tuple(graph_batch_sizes or ())
        max_bs = None
        init_path, base = "$", "$"
    else:
        from specctl.schemas.deployment import load_deployment, override_path

        kind = "deployment"
        dep = load_deployment(config, overrides=overrides)
        role_name = next((r for r in ("decode", "colocated") if r in dep.roles), None)
        if role_name is None:
            raise UsageError(
                f"{config}: no decode or colocated role (roles: {', '.join(dep.roles)}); nothing decodes here",
            )
        role = dep.role(role_name)
        spec, serve = role["speculative"], role["serve"]
        if not spec.get("adaptive") or spec.get("algorithm") == "none":
            raise UsageError(
                f"{config}: the {role_name} role has no adaptive steps (algorithm {spec.get('algorithm')}, "
                f"fixed num_steps {spec.get('num_steps')}); nothing to simulate",
                hint="add speculative.adaptive with buckets, or pass an SGLang adaptive JSON",
            )
        base = override_path(dep.raw, role_name, "speculative", "adaptive")
        init_path = override_path(dep.raw, role_name, "speculative", "num_steps")
        cfg, findings = parse_deployment_adaptive(spec["adaptive"], base_path=base)
        if initial_steps is None:
            initial_steps = spec.get("num_steps")
        graphs = tuple(serve.get("graph_batch_sizes") or ()) if graph_batch_sizes is None else tuple(graph_batch_sizes)
        max_bs = serve.get("max_batch_size")
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
    )


def simulate(setup: SimulationSetup, records: Sequence[TraceRecord]) -> tuple[list[SimStep], Any]:
    """Replay `records` through a fresh policy; the steps after each record and the final policy."""
    from specctl.engine.adaptive import AdaptivePolicy

    index = 0
    policy = AdaptivePolicy(
        setup.cfg, initial_steps=setup.initial_steps, graph_batch_sizes=setup.graph_batch_sizes,
        clock=lambda: float(index),  # switches are stamped with the trace index
    )
    out: list[SimStep] = []
    for index, rec in enumerate(records):
        state = policy.bucket_for_batch(rec.batch_size)
        ran = state.steps
        new = policy.on_verify_complete(rec.accepted, rec.batch_size)
        mean = sum(rec.accepted) / len(rec.accepted) if rec.accepted else None
        out.append(SimStep(
            index, rec.batch_size, state.bucket.min_batch_size, ran, state.steps, state.ema, new is not None, mean,
        ))
    return out, policy


def render_text(setup: SimulationSetup, steps: Sequence[SimStep], policy: Any) -> str:
    """The per-record table and a summary: switches, batches run at each step, final bucket states."""
    head = ("index", "batch", "bucket", "ran", "accepted", "ema", "steps", "")
    rows = [
        (
            str(s.index), str(s.batch_size), str(s.bucket), str(s.ran_steps),
            "-" if s.mean_accepted is None else f"{s.mean_accepted:.2f}",
            f"{s.ema:.3f}", str(s.steps), f"switch {s.ran_steps} -> {s.steps}" if s.switched else "",
        )
        for s in steps
    ]
    widths = [max(len(r[i]) for r in (head, *rows)) for i in range(len(head))]
    lines = ["  ".join(c.rjust(w) for c, w in zip(r, widths, strict=True)).rstrip() for r in (head, *rows)]
    run = [s for s in steps if s.mean_accepted is not None]
    empty = len(steps) - len(run)
    lines.append("")
    graphs = ", ".join(map(str, setup.graph_batch_sizes)) or "none"
    lines.append(
        f"{setup.source}: {len(steps)} verify records ({empty} empty), initial steps {setup.initial_steps}, "
        f"graph batch sizes: {graphs}"
    )
    lines.append(f"switches: {len(policy.switches)}")
    for sw in policy.switches:
        lines.append(f"  at {int(sw.time)}: bucket {sw.bucket}: {sw.from_steps} -> {sw.to_steps} (ema {sw.ema:.3f})")
    lines.append("batches run at each step:")
    counts = Counter(s.ran_steps for s in run)
    for step in sorted(counts):
        lines.append(f"  steps {step}: {counts[step]} ({100.0 * counts[step] / len(run):.1f}%)")
    if not run:
        lines.append("  (no non-empty batches)")
    lines.append("final state per bucket:")
    for key, st in policy.buckets.items():
        lines.append(f"  bucket {key}: steps {st.steps}, ema {st.ema:.3f}, batches {st.batches}")
    return "\n".join(lines) + "\n"


def parse_int_list(text: str, *, option: str) -> list[int]:
    """`"1,2,4"` -> [1, 2, 4]; UsageError naming the option otherwise."""
    items = [t.strip() for t in text.replace(" ", ",").split(",") if t.strip()]
    try:
        values = [int(t) for t in items]
    except ValueError:
        values = []
    if not values or any(v < 1 for v in values):
        raise UsageError(f"{option} {text!r}: expected comma-separated positive integers, e.g. 1,2,4,8")
    return values


def _print_findings(findings: Sequence[Finding], source: str) -> None:
    # One unwrapped line per finding (grep- and editor-friendly), as `validate` prints them.
    for f in findings:
        where = f"{source}:{f.line}" if f.line is not None else source
        sys.stderr.write(f"{where}: {f.code} {f.path}: {f.severity}: {f.message}\n")
        if f.fix:
            sys.stderr.write(f"    fix: {f.fix}\n")


@adaptive_app.command("simulate")
def simulate_command(
    config: Annotated[str, typer.Argument(
        help="SGLang adaptive-config JSON, or a deployment file / preset (its decode or colocated role).",
        show_default=False)],
    trace: Annotated[Path, typer.Option(
        "--trace", help='JSON Lines, one verify per line: {"batch_size": 4, "accepted": [2, 3, 0, 1]}.',
        show_default=False)],
    initial_steps: Annotated[Optional[int], typer.Option(  # noqa: UP045 - Typer reads annotations at runtime
        "--initial-steps", min=0, help="Initial steps (default: the deployment's num_steps, or SGLang's default: "
        "the middle of the candidates' union).", show_default=False)] = None,
    graph_batch_sizes: Annotated[Optional[str], typer.Option(  # noqa: UP045
        "--graph-batch-sizes", metavar="1,2,4,8", help="Batch sizes a batch is padded up to before bucket routing "
        "(default: the deployment's serve.graph_batch_sizes; none for SGLang JSON).", show_default=False)] = None,
    set_values: SetOption = None,
    output: Annotated[OutputFormat, typer.Option("--format", help="Report format.")] = OutputFormat.text,
) -> None:
    """Replay recorded verify results through the adaptive step policy and print each decision."""
    with handle_errors():
        graphs = parse_int_list(graph_batch_sizes, option="--graph-batch-sizes") if graph_batch_sizes else None
        try:
            setup = load_setup(config, initial_steps=initial_steps, graph_batch_sizes=graphs,
                               overrides=set_values or ())
        except InvalidInput as exc:
            _print_findings(getattr(exc, "findings", ()), config)
            raise
        records = read_trace(trace)
        _print_findings([f for f in setup.findings if f.severity != "info"], config)
        steps, policy = simulate(setup, records)
        if output is OutputFormat.json:
            sys.stdout.write("".join(json.dumps(s.to_json()) + "\n" for s in steps))
        else:
            sys.stdout.write(render_text(setup, steps, policy))
