"""`specctl adaptive simulate|profile|tune`: the adaptive-steps policy offline.

- `simulate CONFIG --trace FILE`: replay recorded verify results through the policy (below).
- `profile -c DEPLOY`: measure one decode step's cost per (batch size, steps) -> cost model JSON
  (`specctl.engine.speculative.profile`; this one imports torch, the others do not).
- `tune CONFIG --trace FILE --cost FILE`: counterfactual replay of an engine trace (recorded with
  `serve|bench --trace-out FILE [--trace-steps K]`) through the same policy, searching candidate sets
  and knobs per bucket for the best predicted tokens/s (`specctl.adaptive.tune`).

CONFIG is an SGLang `--speculative-adaptive-config` JSON, or a deployment file / preset (its decode
or colocated role's `speculative.adaptive`). TRACE is JSON Lines, one verify per line:
`{"batch_size": 4, "accepted": [2, 3, 0, 1]}` (accepted draft tokens per request; the engine's
extra keys -- steps, drafted, rids, times -- are described in `specctl.adaptive.trace`; blank lines
skipped). The policy is the engine's own (`specctl.adaptive.policy`), so what
this prints is what the engine would do. `--format json` prints one object per trace record:
`{"index", "batch_size", "steps", "ema", "switched"}`: the 0-based record number (blank lines are
skipped), then the routed bucket's steps and EMA after that update and whether it switched. Text
prints a table and a summary (switches, batches run at each step).

Exit codes: 0 ok; 1 the config has error findings (printed on stderr, like `validate`); 2 unreadable
config or trace (a bad trace line is named by its line number). Torch-free.
"""

from __future__ import annotations

import json
import sys
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, Optional

import typer

from specctl.adaptive.trace import MAX_TRACE_LINE, TraceRecord, read_trace  # noqa: F401 - re-exported
from specctl.cli.common import OutputFormat, handle_errors
from specctl.cli.main import app
from specctl.cli.options import SetOption
from specctl.errors import InvalidInput, UsageError
from specctl.schemas.adaptive import AdaptiveConfig, StepCoverage
from specctl.schemas.findings import Finding

if TYPE_CHECKING:
    from specctl.adaptive.policy import AdaptivePolicy
    from specctl.adaptive.tune import TuneResult
    from specctl.schemas.loader import Document

adaptive_app = typer.Typer(
    help="Adaptive speculative steps: replay traces through the step policy (simulate), measure step costs "
    "(profile), recommend a config from a trace and a cost model (tune).", no_args_is_help=True
)
app.add_typer(adaptive_app, name="adaptive")

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


def _with_positions(findings: Sequence[Finding], doc: Document) -> list[Finding]:
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
        engine = None
        cfg, findings = parse_sglang_config(doc.data)
        graphs = tuple(graph_batch_sizes or ())
        max_bs = None
        init_path, base = "$", "$"
    else:
        from specctl.schemas.deployment import load_deployment, override_path

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


def simulate(setup: SimulationSetup, records: Sequence[TraceRecord]) -> tuple[list[SimStep], Any]:
    """Replay `records` through a fresh policy; the steps after each record and the final policy."""
    from specctl.adaptive.policy import AdaptivePolicy

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


def render_text(setup: SimulationSetup, steps: Sequence[SimStep], policy: AdaptivePolicy) -> str:
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


def _setup(config: str, initial_steps: int | None, graph_batch_sizes: str | None,
           set_values: Sequence[str] | None) -> SimulationSetup:
    """The adaptive config of CONFIG (SGLang JSON or deployment), with its findings printed if it is invalid."""
    graphs = parse_int_list(graph_batch_sizes, option="--graph-batch-sizes") if graph_batch_sizes else None
    try:
        return load_setup(config, initial_steps=initial_steps, graph_batch_sizes=graphs, overrides=set_values or ())
    except InvalidInput as exc:
        _print_findings(getattr(exc, "findings", ()), config)
        raise


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
        setup = _setup(config, initial_steps, graph_batch_sizes, set_values)
        records = read_trace(trace)
        _print_findings([f for f in setup.findings if f.severity != "info"], config)
        steps, policy = simulate(setup, records)
        if output is OutputFormat.json:
            sys.stdout.write("".join(json.dumps(s.to_json()) + "\n" for s in steps))
        else:
            sys.stdout.write(render_text(setup, steps, policy))


def _engine_config(config: str, overrides: Sequence[str]) -> tuple[Any, str]:
    """(EngineConfig, role name) of the deployment's decoding role (decode, else colocated)."""
    from specctl.engine.config import EngineConfig
    from specctl.schemas.deployment import load_deployment

    dep = load_deployment(config, overrides=overrides)
    role_name = next((r for r in ("decode", "colocated") if r in dep.roles), None)
    if role_name is None:
        raise UsageError(f"{config}: no decode or colocated role (roles: {', '.join(dep.roles)}); nothing decodes here")
    return EngineConfig.from_role(dep.role(role_name)), role_name


@adaptive_app.command("profile")
def profile_command(
    config: Annotated[Optional[str], typer.Option(  # noqa: UP045
        "-c", "--config", help="Deployment file or preset: its decode (or colocated) role is profiled in this "
        "process, or, with --relaunch (implied by engine: sglang), the deployment is launched at each of --steps "
        "in turn and measured as it serves.", show_default=False)] = None,
    url: Annotated[Optional[list[str]], typer.Option(  # noqa: UP045
        "--url", metavar="URL", help="Measure a running server (specctl's or SGLang's, directly or behind a "
        "router) at the steps it runs; repeat for servers at other fixed steps (a server without speculation "
        "gives steps 0). The server must run fixed steps (adaptive off).", show_default=False)] = None,
    relaunch: Annotated[bool, typer.Option(
        "--relaunch", help="With -c: launch the deployment at each of --steps (speculative.num_steps=K, adaptive "
        "off; K = 0 without speculation), measure it as --url does, and stop it. Implied by engine: sglang "
        "(which needs the GPU SGLang runs on).")] = False,
    batch_sizes: Annotated[str, typer.Option("--batch-sizes", metavar="1,2,4,8",
                                             help="Batch sizes to measure.")] = "1,2,4,8",
    steps: Annotated[Optional[str], typer.Option(  # noqa: UP045
        "--steps", metavar="0,1,...", help="Speculative steps to measure (0 = plain decoding; default "
        "0,1,...,7). Not with --url: a server measures the steps it runs.", show_default=False)] = None,
    rounds: Annotated[Optional[int], typer.Option(  # noqa: UP045
        "--rounds", min=1, help="Interleaved rounds over the steps (in process; default 6), or waves per batch "
        "size (served; default 3).", show_default=False)] = None,
    iters: Annotated[int, typer.Option("--iters", min=1, help="Timed engine steps per point and round "
                                       "(in process).")] = 6,
    max_tokens: Annotated[int, typer.Option(
        "--max-tokens", min=2, help="Served: tokens each request generates (ignore_eos); longer requests "
        "time more steps each.")] = 64,
    request_timeout: Annotated[float, typer.Option(
        "--request-timeout", min=1.0, help="Served: seconds one request may take.")] = 300.0,
    estimate_steps: Annotated[Optional[str], typer.Option(  # noqa: UP045
        "--estimate-steps", metavar="1,2,4", help="Add these steps, not measured, as an ESTIMATE: linear in the "
        "steps through the two nearest measured ones at each batch size. The cost model is then labelled an "
        "estimate (meta.estimate), and `tune` says so.", show_default=False)] = None,
    aic_system: Annotated[Optional[str], typer.Option(  # noqa: UP045
        "--aiconfigurator-system", metavar="SYSTEM", help="Measure nothing: ESTIMATE every point with NVIDIA's "
        "aiconfigurator (pip install \"specctl[aiconfigurator]\") for this GPU system (e.g. h100_sxm), offline, "
        "for the models it ships configs for; labelled an estimate in the JSON and in what `tune` prints.",
        show_default=False)] = None,
    aic_model: Annotated[Optional[str], typer.Option(  # noqa: UP045
        "--aiconfigurator-model", metavar="ID", help="The model aiconfigurator estimates (a Hugging Face id it "
        "ships, or a local model directory; default: -c's model.target).", show_default=False)] = None,
    aic_backend: Annotated[str, typer.Option(
        "--aiconfigurator-backend", help="The serving engine's performance database: sglang, vllm or trtllm.")]
    = "sglang",
    aic_tp: Annotated[int, typer.Option("--aiconfigurator-tp", min=1, help="Tensor parallel size estimated.")] = 1,
    temperature: Annotated[float, typer.Option(
        "--temperature", min=0.0, help="Sampling temperature of the profiled requests: match the workload's "
        "(sampled verify is rejection sampling, which costs somewhat more than greedy).")] = 0.0,
    sampled_temperature: Annotated[Optional[float], typer.Option(  # noqa: UP045
        "--sampled-temperature", min=0.0, help="Also measure a table for sampled requests at this temperature "
        "(e.g. 1.0): `tune` then prices each traced verify by how many of its requests sampled, so a workload "
        "that mixes greedy and sampled requests is costed as it runs.", show_default=False)] = None,
    threads: Annotated[Optional[int], typer.Option(  # noqa: UP045
        "--threads", min=1, help="torch intra-op threads (default: torch's). Match what the served role gets: "
        "`up` gives each engine process cpu_count / engines.", show_default=False)] = None,
    clock: Annotated[str, typer.Option(
        "--clock", help="wall: elapsed time; cpu: this process's CPU time, which other jobs on a shared machine "
        "disturb far less (equal to wall on an idle machine when --threads 1 on a CPU device).")] = "wall",
    prompt_tokens: Annotated[Optional[int], typer.Option(  # noqa: UP045
        "--prompt-tokens", min=1, help="Prompt length of the profiled requests, in tokens (default: a built-in "
        "code prompt of ~90). A step costs more at longer contexts: match the workload's prompts.",
        show_default=False)] = None,
    output: Annotated[Optional[Path], typer.Option(  # noqa: UP045
        "--output", "-o", help="Write the cost model here (default: stdout).", show_default=False)] = None,
    report_format: Annotated[OutputFormat, typer.Option(
        "--format", help="With --output: the summary on stdout as text or one JSON object (without --output, "
        "stdout is the cost model's JSON).")] = OutputFormat.text,
    set_values: SetOption = None,
) -> None:
    """Measure one decode step's time (draft + verify) per (batch size, steps): the cost model `tune` reads.

    Measured three ways, one JSON. In process (-c DEPLOY): runs the deployment's engine here (no server), requests kept
    decoding at each batch size while the decoder is pinned to each step in turn; medians over interleaved
    rounds. For a colocated role each point also measures its refill: what the steps after a request joins
    take beyond settled ones, which `tune` adds where requests joined; a PD decode role prefills nothing
    itself: no refill there.

    On a running server (--url URL): waves of --batch-sizes streamed requests sent together; each request's
    first-to-last-token time over its verify count (SGLang's spec_verify_ct, in sglext.spec_tokens_details)
    is one step at that batch size; medians over --rounds waves. A server runs one fixed step K, so it gives
    the column K (a server without speculation gives 0, which tune needs for its baseline): repeat --url for
    servers at other steps. The times are served steps (they include the serving loop's turn).

    Relaunched (-c DEPLOY --relaunch --steps 0,3,5): the deployment launched at each step in turn (on free
    ports) and measured as --url does: every K measured on the engine the deployment names (engine: sglang
    needs its GPU). --estimate-steps fills steps nobody measured, and --aiconfigurator-system prices every point
    from NVIDIA's aiconfigurator (an optional extra) where no GPU is at hand: both labelled an estimate, in the
    JSON and in what `tune` prints. Progress on stderr.
    Exit codes: 0 ok, 2 bad options or an adaptive server, 3 a server that fails or cannot launch.
    """
    with handle_errors():
        sizes = parse_int_list(batch_sizes, option="--batch-sizes")
        if sorted(set(sizes)) != sorted(sizes) or min(sizes) < 1:
            raise UsageError(f"--batch-sizes {batch_sizes!r}: expected distinct integers >= 1, e.g. 1,2,4,8")
        step_list = _parse_steps(steps) if steps is not None else list(range(8))

        def progress(line: str) -> None:
            sys.stderr.write(line + "\n")

        if url and config is not None:
            raise UsageError("give --url URL (a running server) or -c DEPLOY, not both")
        if relaunch and config is None:
            raise UsageError("--relaunch launches a deployment: give -c DEPLOY")
        if aic_system is not None:
            if url or relaunch:
                raise UsageError("--aiconfigurator-system estimates instead of measuring: not with --url or --relaunch")
            cost = _aiconfigurator_estimate(config, set_values or (), aic_model, aic_system, aic_backend, aic_tp,
                                            sizes, step_list, prompt_tokens, progress)
            _write_cost(cost, output, report_format)
            return
        if url or relaunch or _sglang_engine(config, set_values or ()):
            unsupported = [name for name, given in (("--sampled-temperature", sampled_temperature is not None),
                                                    ("--temperature", temperature != 0.0),
                                                    ("--threads", threads is not None), ("--clock", clock != "wall"))
                           if given]
            if unsupported:
                raise UsageError(f"{', '.join(unsupported)}: in-process options; a served measurement sends greedy "
                                 "requests and times them by the wall clock",
                                 hint="drop them, or profile in process (-c DEPLOY without --relaunch)")
        if url:
            from specctl.adaptive.served_cost import merge_cost_models
            from specctl.bench.step_cost import profile_urls

            if steps is not None:
                raise UsageError("--steps applies to -c DEPLOY: a server measures the steps it runs",
                                 hint="run servers at other fixed steps and repeat --url, or use -c DEPLOY --relaunch")
            profiles = profile_urls(url, sizes, rounds=rounds or 3, max_tokens=max_tokens, timeout_s=request_timeout,
                                    prompt_tokens=prompt_tokens, progress=progress)
            cost = merge_cost_models([p.model for p in profiles])
        elif config is None:
            raise UsageError("give -c DEPLOY (in process, or --relaunch) or --url URL (a running server)")
        elif relaunch or _sglang_engine(config, set_values or ()):
            from specctl.bench.step_cost import profile_relaunch

            cost = profile_relaunch(config, step_list, sizes, overrides=set_values or (), rounds=rounds or 3,
                                    max_tokens=max_tokens, timeout_s=request_timeout, prompt_tokens=prompt_tokens,
                                    progress=progress)
        else:
            cost = _profile_in_process(config, set_values or (), sizes, step_list, rounds=rounds or 6, iters=iters,
                                       temperature=temperature, sampled_temperature=sampled_temperature,
                                       threads=threads, clock=clock, prompt_tokens=prompt_tokens, progress=progress)
        if estimate_steps is not None:
            from specctl.adaptive.served_cost import with_estimated_steps

            cost = with_estimated_steps(cost, _parse_steps(estimate_steps),
                                        "--estimate-steps: no measurement at these steps")
        _write_cost(cost, output, report_format)


def _aiconfigurator_estimate(config: str | None, overrides: Sequence[str], model: str | None, system: str,
                             backend: str, tp: int, sizes: Sequence[int], step_list: Sequence[int],
                             prompt_tokens: int | None, progress: Callable[[str], None]) -> Any:
    """aiconfigurator's labelled estimate of the deployment's (or --aiconfigurator-model's) steps."""
    from specctl.adaptive.aiconfigurator_cost import estimate_costs

    if model is None:
        if config is None:
            raise UsageError("--aiconfigurator-system needs the model: -c DEPLOY or --aiconfigurator-model ID")
        from specctl.schemas.deployment import load_deployment

        dep = load_deployment(config, overrides=overrides)
        role = next((r for r in ("decode", "colocated") if r in dep.roles), None)
        target = dep.role(role).model.target if role is not None else None
        if not isinstance(target, str) or not target:
            raise UsageError(f"{config}: no model.target to estimate", hint="pass --aiconfigurator-model ID")
        model = target
    return estimate_costs(model, system, sizes, step_list, backend=backend, isl=prompt_tokens or 512, tp_size=tp,
                          progress=progress)


def _sglang_engine(config: str | None, overrides: Sequence[str]) -> bool:
    """Whether the deployment runs SGLang (which this process cannot run: it is measured relaunched)."""
    if config is None:
        return False
    from specctl.schemas.deployment import load_deployment

    return load_deployment(config, overrides=overrides).engine == "sglang"


def _profile_in_process(config: str, overrides: Sequence[str], sizes: Sequence[int], step_list: Sequence[int], *,
                        rounds: int, iters: int, temperature: float, sampled_temperature: float | None,
                        threads: int | None, clock: str, prompt_tokens: int | None,
                        progress: Callable[[str], None]) -> Any:
    from specctl.engine.install import require_engine

    require_engine("specctl adaptive profile")
    if clock not in ("wall", "cpu"):
        raise UsageError(f"--clock {clock!r}: expected wall or cpu", hint="pass --clock wall or --clock cpu")
    cfg, role = _engine_config(config, overrides)
    from specctl.engine.speculative.profile import profile_costs

    if threads is not None:
        import torch

        torch.set_num_threads(threads)
    return profile_costs(cfg, sizes, step_list, rounds=rounds, iters=iters, temperature=temperature,
                         sampled_temperature=sampled_temperature, clock=clock, prompt_tokens=prompt_tokens,
                         refill=role == "colocated", progress=progress)


def _write_cost(cost: Any, output: Path | None, report_format: OutputFormat) -> None:
    """The cost model to --output (and a summary on stdout) or to stdout; a missing steps 0 is said."""
    text = json.dumps(cost.to_json(), indent=2) + "\n"
    notes = []
    if 0 not in cost.steps:
        notes.append("no steps 0 (plain decoding) measured: `tune` prices no speculation with it; add a server "
                     "without speculation (another --url), or --relaunch with 0 in --steps")
    if cost.estimate is not None:
        notes.append(f"an ESTIMATE, not a measurement: {cost.estimate}")
    for note in notes:
        sys.stderr.write(f"note: {note}\n")
    if output is None:
        sys.stdout.write(text)
        return
    try:
        output.write_text(text)
    except OSError as exc:
        raise UsageError(f"{output}: cannot write the cost model: {exc.strerror or exc}") from None
    summary = {"output": str(output), "batch_sizes": list(cost.batch_sizes), "steps": list(cost.steps),
               "measured_steps": cost.meta.get("served_steps", list(cost.steps)), "estimate": cost.estimate,
               "step_s": {str(b): {str(k): t for k, t in row.items()} for b, row in sorted(cost.step_s.items())},
               "notes": notes}
    if report_format is OutputFormat.json:
        sys.stdout.write(json.dumps(summary) + "\n")
    else:
        sys.stdout.write(f"wrote {output}: steps {list(cost.steps)} at batch sizes {list(cost.batch_sizes)}"
                         + (" (an ESTIMATE)" if cost.estimate is not None else "") + "\n")


def _parse_steps(text: str) -> list[int]:
    items = [t.strip() for t in text.replace(" ", ",").split(",") if t.strip()]
    try:
        values = sorted({int(t) for t in items})
    except ValueError:
        values = []
    if not values or values[0] < 0:
        raise UsageError(f"--steps {text!r}: expected comma-separated integers >= 0, e.g. 0,1,3,5,7")
    return values


@adaptive_app.command("tune")
def tune_command(
    config: Annotated[str, typer.Argument(
        help="The current config: SGLang adaptive JSON, or a deployment file / preset.", show_default=False)],
    trace: Annotated[Path, typer.Option(
        "--trace", help="Verify trace from `serve/bench --trace-out` (best: recorded with --trace-steps K).",
        show_default=False)],
    cost: Annotated[Path, typer.Option("--cost", help="Cost model from `specctl adaptive profile`.",
                                       show_default=False)],
    initial_steps: Annotated[Optional[int], typer.Option(  # noqa: UP045
        "--initial-steps", min=0, help="The current config's initial steps (default: as `simulate`).",
        show_default=False)] = None,
    graph_batch_sizes: Annotated[Optional[str], typer.Option(  # noqa: UP045
        "--graph-batch-sizes", metavar="1,2,4,8", help="Graph batch sizes for routing (default: the "
        "deployment's).", show_default=False)] = None,
    steps: Annotated[Optional[str], typer.Option(  # noqa: UP045
        "--steps", metavar="0,1,3,5", help="Search only these steps (e.g. the ones you capture graphs for; "
        "default: every step the cost model measures up to the trace's depth).", show_default=False)] = None,
    sglang: Annotated[bool, typer.Option(
        "--sglang", help="Search only what SGLang can run: no specctl-only knobs (zero_backoff, "
        "zero_threshold). Implied by a "
        "deployment with engine: sglang.")] = False,
    decode_only: Annotated[bool, typer.Option(
        "--decode-only", help="Predict decode speed alone: leave out the serving time the trace measured "
        "beyond the cost model: the time between verifies (prefill, admission, streaming), which every "
        "config pays per token, and verifies slower than profiled on a shared machine, a factor on every "
        "config's decode price.")] = False,
    set_values: SetOption = None,
    output: Annotated[OutputFormat, typer.Option("--format", help="Report format.")] = OutputFormat.text,
) -> None:
    """Recommend an adaptive config: replay the trace counterfactually through the step policy, maximise
    predicted tokens/s under the cost model, and validate the recommendation.

    A verify that drafted K tokens and accepted a would have accepted min(a, k) with any k <= K, so a trace
    recorded with `--trace-steps K` answers every candidate up to K. Candidate sets (up to four steps) per
    bucket and the knobs ema_alpha, update_interval and the hystereses are searched, and for sets with 0
    specctl's zero_backoff and zero_threshold (kept off unless they predict >= 1% better). The result prints
    as a deployment snippet and, when SGLang can express it, as SGLang JSON; a recommendation with a
    specctl-only knob (which SGLang ignores) also prints the best config SGLang can run. Each comes with its
    predicted speed-up over the current config, the best fixed step and no speculation; the predictions
    include the serving time the trace measured beyond the cost model, as a real run pays it, unless
    --decode-only: the time between verifies (prefill, admission, streaming) per token, the factor by
    which served verifies ran slower than profiled (a machine shared with the prefill server, the router and
    the clients), and the draft's pass over each joining request's prompt, which plain decoding never runs.
    The speed-ups over the best fixed step and no speculation come with 95% intervals over resamples of the
    trace's requests: a short trace of sampled text cannot tell configs a few percent apart, and says so.
    A trace of several runs (engines: workloads, concurrencies) gets one config for all of them; each run
    replayed alone then shows where a fixed step would serve it better (`runs` in --format json). Tune on
    one workload's trace for a config for that workload. Confirm it with `specctl bench --ab`.
    """
    with handle_errors():
        from specctl.adaptive.tune import TuneSetup, read_cost, tune

        setup = _setup(config, initial_steps, graph_batch_sizes, set_values)
        records = read_trace(trace)
        cost_model = read_cost(cost)
        rows = setup.coverage.rows
        max_bs = rows[-1].batch_max if rows else None
        allowed = tuple(_parse_steps(steps)) if steps else None
        sglang_only = sglang or setup.engine == "sglang"

        def progress(line: str) -> None:
            sys.stderr.write(f"tune: {line}\n")

        from specctl.adaptive.trace import read_requests

        result = tune(TuneSetup(setup.cfg, setup.initial_steps, setup.graph_batch_sizes, max_bs, allowed,
                                sglang=sglang_only, decode_only=decode_only), records, cost_model, progress=progress,
                      requests=read_requests(trace))
        if output is OutputFormat.json:
            sys.stdout.write(json.dumps(result.to_json(), indent=2) + "\n")
        else:
            sys.stdout.write(render_tune(result))


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


@adaptive_app.command("trace")
def trace_command(
    from_sglang_metrics: Annotated[Optional[Path], typer.Option(  # noqa: UP045
        "--from-sglang-metrics", metavar="FILE", help="SGLang's --export-metrics-to-file file, --log-requests "
        "output (json or text format), or a DSPARK dump (SGLANG_DSPARK_DEBUG_DUMP=reqs: /server_info's "
        "internal_states[].dspark_info_record).", show_default=False)] = None,
    from_trace: Annotated[Optional[Path], typer.Option(  # noqa: UP045
        "--from-trace", metavar="FILE", help="An engine trace (`serve --trace-out`) to write in the form SGLang "
        "reports it: one histogram line per request (what `tune` would see of the same run from SGLang).",
        show_default=False)] = None,
    out: Annotated[Optional[Path], typer.Option(  # noqa: UP045
        "-o", "--output", help="Write the trace here (appended; default: stdout).", show_default=False)] = None,
    steps: Annotated[Optional[int], typer.Option(  # noqa: UP045
        "--steps", min=1, metavar="K", help="The server's launch-time draft length (--speculative-num-steps), "
        "when the file cannot give it (SGLang's spec_num_proposed_drafts / spec_verify_ct gives it).",
        show_default=False)] = None,
    batch_size: Annotated[Optional[int], typer.Option(  # noqa: UP045
        "--batch-size", min=1, metavar="B", help="The batch every request decoded in (default: estimated from "
        "the requests' times, which SGLang writes with --enable-metrics; 1 without them).",
        show_default=False)] = None,
    run: Annotated[Optional[str], typer.Option(  # noqa: UP045
        "--run", help="A run name for these requests (one adaptive policy replays each run).",
        show_default=False)] = None,
    keep_order: Annotated[bool, typer.Option(
        "--keep-order", help="With --from-trace: keep each request's verifies in order (`accepted`).")] = False,
    output: Annotated[OutputFormat, typer.Option("--format", help="Summary format (on stderr with no -o).")]
    = OutputFormat.text,
) -> None:
    """Write a trace `specctl adaptive tune` reads from what an engine reports per request.

    SGLang reports, per finished request, its verify count and correct-drafts histogram (how many verifies
    accepted k drafts), not the verifies themselves: each becomes one request line with the launch-time
    steps K and the batch it decoded in. Fixed-step predictions from such lines are exact; the adaptive
    policy's replay assumes an order (see `tune`'s notes), and nothing above K is recommended. A DSPARK
    dump holds every verify: it becomes verify lines, as an engine trace. `specctl bench --url URL
    --trace-out FILE` writes the same lines from the responses themselves.
    """
    with handle_errors():
        from specctl.adaptive.sglang_trace import append_lines, read_sglang_output
        from specctl.adaptive.trace import RequestRecord, request_form

        if (from_sglang_metrics is None) == (from_trace is None):
            raise UsageError("give exactly one of --from-sglang-metrics FILE or --from-trace FILE")
        skipped = 0
        lines: list[RequestRecord | TraceRecord]
        if from_sglang_metrics is not None:
            reqs, verifies, skipped = read_sglang_output(from_sglang_metrics, steps=steps, batch_size=batch_size,
                                                         run=run)
            lines = [*reqs, *verifies]
            source = str(from_sglang_metrics)
        else:
            assert from_trace is not None
            lines = list(request_form([r for r in read_trace(from_trace) if r.accepted], keep_order=keep_order))
            source = str(from_trace)
        if out is not None:
            append_lines(out, lines)
        else:
            for line in lines:
                sys.stdout.write(json.dumps(line.to_json(), separators=(",", ":")) + "\n")
        n_req = sum(isinstance(x, RequestRecord) for x in lines)
        summary = {"source": source, "output": str(out) if out is not None else None, "requests": n_req,
                   "verify_records": len(lines) - n_req, "skipped_lines": skipped,
                   "steps": sorted({x.steps for x in lines if x.steps is not None})}
        stream = sys.stdout if out is not None else sys.stderr
        if output is OutputFormat.json:
            stream.write(json.dumps(summary) + "\n")
        else:
            stream.write(f"{source}: {n_req} request line(s), {summary['verify_records']} verify line(s) "
                         f"at steps {summary['steps']}" + (f", {skipped} line(s) without speculative statistics"
                                                            if skipped else "")
                         + (f" -> {out}" if out is not None else "") + "\n")
