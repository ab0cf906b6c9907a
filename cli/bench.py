"""`specctl bench` (load-test a server or a launched deployment) and `specctl bench compare A B`.

Thin: options become one `BenchConfig`, `specctl.bench.runner.run_bench` does the work, and the
records are rendered (text tables, or `--format json`: the records as JSON Lines, the same shape
`--output` appends), appended to
`--output`, and plotted to `--plot`. Progress goes to stderr. Exit 0 when at least one request
completed, 3 when none did (after printing what was measured), 2 for bad options.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from specctl.cli.common import OutputFormat, handle_errors, stderr_console, stdout_console
from specctl.cli.main import app
from specctl.cli.options import SetOption

if TYPE_CHECKING:
    from collections.abc import Callable, Sequence
    from typing import Any

    from rich.console import Console

    from specctl.bench.config import BenchConfig
    from specctl.bench.runner import PointRun, Provenance

bench_app = typer.Typer(help="Load-test an OpenAI-compatible server or a deployment; compare results.",
                        invoke_without_command=True, no_args_is_help=False)
app.add_typer(bench_app, name="bench")

_DATASET_HELP = "random | jsonl | sharegpt | shared-prefix | code"


@bench_app.callback()
def bench(
    ctx: typer.Context,
    url: Annotated[str | None, typer.Option("--url", help="Base URL of any OpenAI-compatible server.")] = None,
    config: Annotated[str | None, typer.Option("-c", "--config", help="Deployment file or preset to launch.")] = None,
    set_: SetOption = None,
    endpoint: Annotated[str, typer.Option(help="completions (/v1/completions) or chat (/v1/chat/completions).")]
    = "completions",
    model: Annotated[str | None, typer.Option(help="Model name to send (default: first of /v1/models).")] = None,
    dataset_name: Annotated[str, typer.Option(help=_DATASET_HELP)] = "random",
    dataset_path: Annotated[str | None, typer.Option(help="Prompt file for jsonl / sharegpt.")] = None,
    num_prompts: Annotated[int, typer.Option(help="Requests per sweep point (cycled prompts).")] = 100,
    random_input_len: Annotated[int, typer.Option(help="Prompt length in bytes (random, code).")] = 128,
    random_output_len: Annotated[int, typer.Option(help="max_tokens per request (random, jsonl default, code).")]
    = 64,
    random_range_ratio: Annotated[float, typer.Option(help="Lengths uniform in len*ratio..len; 1 = fixed.")] = 1.0,
    sharegpt_output_len: Annotated[int | None, typer.Option(help="Override ShareGPT output lengths.")] = None,
    gsp_num_groups: Annotated[int, typer.Option(help="shared-prefix: number of shared system prompts.")] = 4,
    gsp_prompts_per_group: Annotated[int, typer.Option(help="shared-prefix: questions per system prompt.")] = 8,
    gsp_system_prompt_len: Annotated[int, typer.Option(help="shared-prefix: system prompt bytes.")] = 256,
    gsp_question_len: Annotated[int, typer.Option(help="shared-prefix: question bytes.")] = 32,
    gsp_output_len: Annotated[int, typer.Option(help="shared-prefix: max_tokens.")] = 64,
    request_rate: Annotated[str, typer.Option(help="Requests/s, or a sweep '1,2,4'; inf = all at once.")] = "inf",
    burstiness: Annotated[float, typer.Option(help="Gamma shape of arrivals: 1 Poisson, <1 burstier, inf constant.")]
    = 1.0,
    max_concurrency: Annotated[str | None, typer.Option(help="Cap on requests in flight, or a sweep '1,4,16'.")]
    = None,
    duration: Annotated[float | None, typer.Option(help="Run each point this many seconds (prompts cycled).")]
    = None,
    warmup_requests: Annotated[int, typer.Option(help="Requests sent first and excluded from metrics.")] = 1,
    seed: Annotated[int, typer.Option(help="Seed of prompts and arrivals.")] = 1,
    slo: Annotated[str | None, typer.Option(help="Goodput SLOs in seconds, e.g. ttft=0.4,tpot=0.04,e2e=5.")]
    = None,
    request_timeout: Annotated[float, typer.Option(help="Seconds before a request counts as a timeout.")] = 300.0,
    disable_stream: Annotated[bool, typer.Option("--disable-stream", help="Non-streaming requests (TTFT = E2E).")]
    = False,
    disable_ignore_eos: Annotated[bool, typer.Option("--disable-ignore-eos",
                                                     help="Do not send ignore_eos (outputs may stop early).")] = False,
    temperature: Annotated[float, typer.Option(help="Sampling temperature sent with every request.")] = 0.0,
    extra_request_body: Annotated[str | None, typer.Option(help="JSON object merged into every request.")]
    = None,
    output: Annotated[Path | None, typer.Option("--output", "--output-file",
                                                   help="Append one JSON record per run to this JSONL file.")] = None,
    plot: Annotated[Path | None, typer.Option(help="Write latency/throughput/steps/acceptance PNG here.")] = None,
    tag: Annotated[str | None, typer.Option(help="Free-form label stored in the record.")] = None,
    output_details: Annotated[bool, typer.Option("--output-details",
                                                 help="Add per-request arrays (ttfts, itls, ...) to records.")]
    = False,
    progress: Annotated[bool, typer.Option(help="Show progress on stderr.")] = True,
    preflight_pair: Annotated[tuple[str, str] | None, typer.Option(
        "--preflight", metavar="PREFILL_URL DECODE_URL",
        help="With --url: first preflight this prefill/decode pair (exit 3 on any difference) and bind both "
             "fingerprints to the records.", show_default=False)] = None,
    format: Annotated[OutputFormat, typer.Option("--format", help="text or json.")] = OutputFormat.text,
    ab: Annotated[list[str] | None, typer.Option(
        "--ab", metavar="KEY=VALUE[;KEY=VALUE]", help="With -c: also launch a variant of the deployment with "
        "these overrides (repeat for more variants) and compare them on the same workload, interleaved in "
        "rounds; e.g. --ab speculative.algorithm=none prints the speed-up of speculation with its interval.")]
    = None,
    ab_url: Annotated[list[str] | None, typer.Option(
        "--ab-url", metavar="URL", help="With --url: compare against this server too (repeatable).")] = None,
    ab_rounds: Annotated[int, typer.Option("--ab-rounds", min=1, help="Rounds the --ab workload is split into "
                                           "(the bootstrap interval resamples them). Each round starts empty and "
                                           "drains: keep about 10x --max-concurrency prompts per round, or the "
                                           "ratio weighs start-up as much as steady serving (the report notes "
                                           "it).")] = 5,
    trace_out: Annotated[str | None, typer.Option(
        "--trace-out", metavar="FILE", help="With --url: ask every request for SGLang's per-request acceptance "
        "(return_spec_tokens_details) and append one line per request to FILE (its launch-time steps, verify "
        "count, correct-drafts histogram, the batch it decoded in; the order of its verifies where the server "
        "gives it): a trace `specctl adaptive tune` reads, from SGLang or specctl alike. With -c: the launched "
        "engines append one JSON line per verify batch to FILE (see `specctl serve --trace-out`).")] = None,
    request_trace_out: Annotated[str | None, typer.Option(
        "--request-trace-out", metavar="FILE", help="With -c: also append one line per request to FILE, as "
        "--trace-out does with --url (what SGLang reports per request), beside the engines' verify trace: "
        "both forms of one run.")] = None,
    trace_steps: Annotated[int | None, typer.Option(
        "--trace-steps", min=1, metavar="K", help="With --trace-out: draft K every step (a counterfactual trace "
        "for `specctl adaptive tune`).")] = None,
) -> None:
    """Load-test a server (--url) or launch a deployment and load-test it (-c); report latency, throughput,
    goodput, errors and speculative acceptance."""
    if ctx.invoked_subcommand is not None:
        return
    with handle_errors():
        from specctl.bench import config as bc
        from specctl.errors import UsageError

        if (url is None) == (config is None):
            raise UsageError("give exactly one of --url URL or -c DEPLOY",
                             hint="e.g. specctl bench --url http://127.0.0.1:30000 or specctl bench -c tiny-pd")
        if url is not None and not url.startswith(("http://", "https://")):
            raise UsageError(f"--url must start with http:// or https://, got {url!r}")
        if endpoint not in bc.ENDPOINTS:
            raise UsageError(f"--endpoint must be one of {', '.join(bc.ENDPOINTS)}, got {endpoint!r}")
        if set_ and config is None:
            raise UsageError("--set applies to a deployment (-c), not to --url")
        if preflight_pair and config is not None:
            raise UsageError("--preflight applies to --url; with -c the launched pair is preflighted itself")
        if request_trace_out and config is None:
            raise UsageError("--request-trace-out goes with -c; with --url, --trace-out writes the request lines")
        if trace_steps and config is None:
            raise UsageError("--trace-steps sets the drafts of the engines bench launches: it needs -c DEPLOY",
                             hint="launch the server at fixed steps K (adaptive off) and pass --trace-out alone")
        if (trace_out or trace_steps) and config is not None:
            from specctl.cli.serve import set_trace_env

            set_trace_env(trace_out, trace_steps)
        workload = bc.WorkloadConfig(
            dataset_name=dataset_name, dataset_path=dataset_path, num_prompts=num_prompts,
            random_input_len=random_input_len, random_output_len=random_output_len,
            random_range_ratio=random_range_ratio, sharegpt_output_len=sharegpt_output_len,
            gsp_num_groups=gsp_num_groups, gsp_prompts_per_group=gsp_prompts_per_group,
            gsp_system_prompt_len=gsp_system_prompt_len, gsp_question_len=gsp_question_len,
            gsp_output_len=gsp_output_len, seed=seed)
        if warmup_requests < 0 or request_timeout <= 0:
            raise UsageError("--warmup-requests must be >= 0 and --request-timeout > 0")
        cfg = bc.BenchConfig(
            url=url or "", endpoint=endpoint, model=model, workload=workload,
            points=bc.sweep_points(bc.parse_rates(request_rate), bc.parse_concurrencies(max_concurrency)),
            burstiness=burstiness, duration_s=duration, warmup_requests=warmup_requests,
            request_timeout_s=request_timeout, slo=bc.parse_slo(slo), stream=not disable_stream,
            ignore_eos=not disable_ignore_eos, temperature=temperature,
            extra_request_body=bc.parse_extra_body(extra_request_body), tag=tag, output_details=output_details,
            spec_trace_out=trace_out if config is None else request_trace_out,
            spec_trace_steps=trace_steps if config is not None else None)
        if ab or ab_url:
            from specctl.bench.ab import parse_ab

            if ab and config is None:
                raise UsageError("--ab varies a deployment: it needs -c DEPLOY (with --url use --ab-url URL)")
            if ab_url and url is None:
                raise UsageError("--ab-url compares servers: it needs --url (with -c use --ab KEY=VALUE)")
            _run_ab(cfg, config, set_ or [], parse_ab(ab or []), list(ab_url or []), rounds=ab_rounds,
                    output=output, plot=plot, fmt=format, show_progress=progress)
            return
        _run(cfg, config, set_ or [], output=output, plot=plot, fmt=format, show_progress=progress,
             preflight_pair=preflight_pair)


def _preflight_provenance(pair: tuple[str, str] | None) -> Provenance:
    from specctl.bench.runner import Provenance
    from specctl.errors import RuntimeFailure
    from specctl.preflight.check import run_preflight

    if pair is None:
        return Provenance()
    report = run_preflight(pair[0], pair[1])
    if not report.ok:
        rows = "; ".join(f"{d.field}: prefill={d.prefill!r} decode={d.decode!r}" for d in report.differences)
        raise RuntimeFailure(f"preflight refused the pair: {rows}",
                             hint=f"run `specctl preflight --prefill {pair[0]} --decode {pair[1]}` for the fixes")
    return Provenance(preflight={"ok": True, **report.fingerprints()})


def _run_ab(cfg: BenchConfig, deploy: str | None, overrides: list[str], variants: list[tuple[str, ...]],
            urls: list[str], *, rounds: int, output: Path | None, plot: Path | None, fmt: OutputFormat,
            show_progress: bool) -> None:
    import contextlib

    from specctl.bench.ab import Variant, comparison, plot_runs, port_overrides, render_comparison, run_ab
    from specctl.bench.progress import make_progress
    from specctl.errors import RuntimeFailure

    err = stderr_console()
    sink = make_progress(err, enabled=show_progress)
    try:
        with contextlib.ExitStack() as stack:
            if deploy is None:
                assert cfg.url
                targets = [Variant("base", (), cfg.url)] + [Variant(u, (), u) for u in urls]
            else:
                from specctl.bench.target import launched
                from specctl.schemas.validator import load_deployment

                raw = load_deployment(deploy, overrides=overrides).raw
                targets = []
                for name, extra in [("base", ())] + [(";".join(v), v) for v in variants]:
                    moved = port_overrides(raw) if extra else []  # variants run next to the base
                    err.print(f"launching {name} ...", markup=False)
                    target = stack.enter_context(launched(deploy, [*overrides, *moved, *extra]))
                    err.print(f"{name} ready at {target.url}", markup=False)
                    targets.append(Variant(name, tuple(extra), target.url, target.provenance))
            runs = run_ab(cfg, targets, rounds=rounds, progress=sink)
    finally:
        if sink is not None:
            sink.close()
    comp = comparison(runs)
    records = [r.record for r in runs]
    _emit(records, [comp], plot_input=plot_runs(runs), output=output, plot=plot, fmt=fmt,
          tail=lambda out: render_comparison(out, comp))
    if not all(rec.get("completed") for rec in records):
        raise RuntimeFailure("a variant completed no request", hint="see errors by kind in its report")


def _run(cfg: BenchConfig, deploy: str | None, overrides: list[str], *, output: Path | None, plot: Path | None,
         fmt: OutputFormat, show_progress: bool, preflight_pair: tuple[str, str] | None = None) -> None:
    from specctl.bench.progress import make_progress
    from specctl.bench.report import render_sweep
    from specctl.bench.runner import run_bench
    from specctl.bench.target import launched
    from specctl.errors import RuntimeFailure

    err = stderr_console()
    sink = make_progress(err, enabled=show_progress)
    try:
        if deploy is None:
            runs = run_bench(cfg, progress=sink, provenance=_preflight_provenance(preflight_pair))
        else:
            last: list[str] = [""]

            def on_status(status: object) -> None:
                line = _status_line(status)
                if line != last[0]:  # the launcher polls several times a second: print changes only
                    last[0] = line
                    err.print(line, markup=False, highlight=False)

            with launched(deploy, overrides, status_callback=on_status) as target:
                err.print(f"deployment ready at {target.url}", markup=False)
                runs = run_bench(dataclasses.replace(cfg, url=target.url), progress=sink,
                                 provenance=target.provenance)
    finally:
        if sink is not None:
            sink.close()
    records = [r.record for r in runs]

    def sweep(out: Console) -> None:
        if len(records) > 1:
            render_sweep(out, records)

    _emit(records, [], plot_input=runs, output=output, plot=plot, fmt=fmt, tail=sweep)
    if not any(rec.get("completed") for rec in records):
        raise RuntimeFailure("no request completed", hint="see errors by kind in the report")


def _emit(records: list[dict[str, Any]], trailer: list[dict[str, Any]], *, plot_input: Sequence[PointRun],
          output: Path | None, plot: Path | None, fmt: OutputFormat, tail: Callable[[Console], None]) -> None:
    """What every bench writes: the records (then `trailer`, e.g. the A/B comparison) appended to --output as
    JSON Lines, the plot, and stdout in the same JSON Lines shape or as tables (`tail` renders what follows the
    per-record tables)."""
    from specctl.bench.record import append_jsonl, json_safe
    from specctl.bench.report import render_record

    lines = [*records, *trailer]
    if output is not None:
        append_jsonl(output, lines)
    if plot is not None:
        from specctl.bench.plot import write_plot

        write_plot(plot, plot_input)
    if fmt is OutputFormat.json:
        for rec in lines:
            typer.echo(json.dumps(json_safe(rec)))
        return
    out = stdout_console()
    if not out.is_terminal:
        out.width = max(out.width, 120)  # files and pipes: no wrapping of the wide latency table
    for rec in records:
        render_record(out, rec)
    tail(out)
    err = stderr_console()
    if output is not None:
        err.print(f"appended {len(lines)} record(s) to {output}", markup=False)
    if plot is not None:
        err.print(f"wrote {plot}", markup=False)


def _status_line(status: object) -> str:
    """The launcher's status report (a message, or a list of per-role statuses) as one line."""
    if isinstance(status, (list, tuple)):
        return "; ".join(f"{getattr(s, 'role', '?')}: {getattr(s, 'state', s)} {getattr(s, 'detail', '')}".rstrip()
                         for s in status)
    return str(status)


@bench_app.command("compare")
def compare(
    a: Annotated[Path, typer.Argument(help="Baseline JSONL (bench --output).")],
    b: Annotated[Path, typer.Argument(help="Candidate JSONL.")],
    index_a: Annotated[int, typer.Option(help="Which record of A (default: last).")] = -1,
    index_b: Annotated[int, typer.Option(help="Which record of B (default: last).")] = -1,
    format: Annotated[OutputFormat, typer.Option("--format", help="text or json.")] = OutputFormat.text,
) -> None:
    """Print two bench records side by side with B-A deltas (lower latency / higher throughput = better)."""
    with handle_errors():
        from specctl.bench.compare import compare_records, pick
        from specctl.bench.record import json_safe, read_jsonl
        from specctl.bench.report import render_compare

        ra = pick(read_jsonl(a), index_a, str(a))
        rb = pick(read_jsonl(b), index_b, str(b))
        rows = compare_records(ra, rb)
        if format is OutputFormat.json:
            typer.echo(json.dumps(json_safe({"a": str(a), "b": str(b), "rows": [r.to_json() for r in rows]}),
                                  indent=2))
        else:
            render_compare(stdout_console(), rows, str(a), str(b))
