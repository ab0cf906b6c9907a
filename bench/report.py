"""Text rendering of bench records: the per-run results table, the sweep summary, the comparison.

Rich tables; on a terminal with colour and box drawing, elsewhere plain ASCII boxes without styles.
Missing values (a server that reports no acceptance, no timings) print as "n/a".
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from rich import box
from rich.console import Console
from rich.table import Table
from rich.text import Text

from specctl.bench.compare import CompareRow

_LAT_ROWS = (("TTFT", "ttft"), ("TPOT", "tpot"), ("ITL (per token)", "itl"), ("Chunk gap (raw)", "chunk_gap"),
             ("E2E latency", "e2e_latency"))
_LAT_COLS = ("mean", "median", "p90", "p99", "std", "max")


def fmt(value: object, digits: int = 2) -> str:
    if value is None:
        return "n/a"
    if isinstance(value, bool):
        return str(value)
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        return f"{value:,.{digits}f}"
    return str(value)


def _box(console: Console) -> box.Box:
    return box.SIMPLE_HEAD if console.is_terminal else box.ASCII


def _kv_table(console: Console, title: str, rows: Sequence[tuple[str, str]]) -> Table:
    t = Table(title=title, box=_box(console), show_header=False, title_justify="left")
    t.add_column("metric")
    t.add_column("value", justify="right")
    for k, v in rows:
        t.add_row(k, v)
    return t


def _sampling(rec: dict[str, Any]) -> str:
    """temperature first (0 is greedy: say so), then every other sampling field sent."""
    sampling = dict(rec.get("sampling") or {})
    if not sampling:
        return "n/a"
    temp = sampling.pop("temperature", None)
    parts = [f"temperature {fmt(temp)}" + (" (greedy)" if temp == 0 else "")]
    parts += [f"{k} {v}" for k, v in sampling.items()]
    return "  ".join(parts)


def render_record(console: Console, rec: dict[str, Any]) -> None:
    rate = rec.get("request_rate")
    conc = rec.get("max_concurrency")
    errors = rec.get("errors") or {}
    summary = [
        ("Target", f"{rec.get('url')}  model={rec.get('model')}  endpoint={rec.get('endpoint')}"),
        ("Load", f"request rate {rate}  max concurrency {conc if conc is not None else 'not set'}"
                 f"  burstiness {fmt(rec.get('burstiness'))}"),
        ("Dataset", f"{rec.get('dataset_name')}  ({rec.get('num_requests')} requests)"),
        ("Sampling", _sampling(rec)),
        ("Successful / failed requests", f"{rec.get('completed')} / {rec.get('failed')}"),
        ("Errors by kind", ", ".join(f"{k}: {v}" for k, v in errors.items()) or "none"),
        ("Benchmark duration (s)", fmt(rec.get("duration"))),
        ("Achieved request rate (req/s)", fmt(rec.get("achieved_request_rate"))),
        ("Send delay mean / p99 (ms)", f"{fmt(rec.get('mean_send_delay_ms'))} / {fmt(rec.get('p99_send_delay_ms'))}"),
        ("Total input / output tokens", f"{rec.get('total_input_tokens')} / {rec.get('total_output_tokens')}"),
        ("Request throughput (req/s)", fmt(rec.get("request_throughput"))),
        ("Input token throughput (tok/s)", fmt(rec.get("input_throughput"))),
        ("Output token throughput (tok/s)", fmt(rec.get("output_throughput"))),
        ("Concurrency", fmt(rec.get("concurrency"))),
    ]
    if rec.get("slo"):
        slo = ", ".join(f"{k}<={v:g}s" for k, v in rec["slo"].items())
        summary.append((f"Goodput ({slo}) (req/s)",
                        f"{fmt(rec.get('goodput'))}  ({fmt(_pct(rec.get('goodput_fraction')), 1)}% of requests)"))
    console.print(_kv_table(console, "Serving benchmark result", summary))

    lat = Table(title="Latency (ms, from scheduled send time)", box=_box(console), title_justify="left")
    lat.add_column("")
    for col in _LAT_COLS:
        lat.add_column(col, justify="right")
    for label, fam in _LAT_ROWS:
        lat.add_row(label, *(fmt(rec.get(f"{col}_{fam}_ms")) for col in _LAT_COLS))
    console.print(lat)

    spec = [("Accept length (tokens/step)", f"{fmt(rec.get('accept_length'))}"
             + (f"  (from {rec['accept_length_source']})" if rec.get("accept_length_source") else ""))]
    per_req = rec.get("accept_length_per_request")
    if per_req:
        spec.append(("Per request p10 / median / p90",
                     f"{fmt(per_req['p10'])} / {fmt(per_req['median'])} / {fmt(per_req['p90'])}"))
    hist = rec.get("accepted_per_step_histogram")
    if hist:
        total = sum(hist.values()) or 1
        spec.append(("Accepted drafts per step", "  ".join(f"{k}:{100 * v / total:.0f}%" for k, v in hist.items())))
    adaptive = rec.get("adaptive") or {}
    switches = adaptive.get("switches")
    spec.append(("Adaptive step switches", "n/a" if switches is None else str(len(switches))))
    if switches:
        tail = switches[-5:]
        spec.append(("Last switches", "; ".join(
            f"{fmt(s.get('t_rel_s'), 1)}s b{s.get('bucket')}: {s.get('from_steps')}->{s.get('to_steps')}"
            for s in tail)))
    per_steps = adaptive.get("batches_per_steps")
    if per_steps:
        total = sum(per_steps.values()) or 1
        spec.append(("Verify batches by steps", "  ".join(f"{k}:{100 * v / total:.0f}%" for k, v in per_steps.items())))
    tps = adaptive.get("time_per_step_ms")
    if isinstance(tps, dict):
        spec.append(("Time per step (ms)", "  ".join(f"steps {k}: {fmt(v)}" for k, v in tps.items())))
    else:
        spec.append(("Time per step (ms)", fmt(tps)))
    spec.append(("Server fingerprint", fmt(rec.get("fingerprint"))))
    console.print(_kv_table(console, "Speculative decoding", spec))

    breakdown = rec.get("ttft_breakdown")
    if breakdown:
        t = Table(title="TTFT breakdown (server-reported, ms)", box=_box(console), title_justify="left")
        for col in ("component", "mean", "median", "p99"):
            t.add_column(col, justify="left" if col == "component" else "right")
        for name, s in breakdown.items():
            t.add_row(name, fmt(s.get("mean")), fmt(s.get("median")), fmt(s.get("p99")))
        console.print(t)

    metrics = rec.get("server_metrics")
    if metrics and metrics.get("counters"):
        # Histogram buckets are in the JSON record; the table keeps to totals, counts and sums.
        rows = sorted((kv for kv in metrics["counters"].items() if "_bucket" not in kv[0]), key=lambda kv: kv[0])[:20]
        console.print(_kv_table(console, "Server /metrics deltas over the run", [(k, fmt(v)) for k, v in rows]))


def render_sweep(console: Console, records: Sequence[dict[str, Any]]) -> None:
    t = Table(title="Sweep summary", box=_box(console), title_justify="left")
    cols = ("rate", "conc", "req/s", "out tok/s", "p50 TTFT", "p99 TTFT", "p99 TPOT", "p99 E2E", "accept", "errors")
    for c in cols:
        t.add_column(c, justify="right")
    for r in records:
        t.add_row(str(r.get("request_rate")), str(r.get("max_concurrency") or "-"),
                  fmt(r.get("request_throughput")), fmt(r.get("output_throughput"), 1),
                  fmt(r.get("median_ttft_ms"), 1), fmt(r.get("p99_ttft_ms"), 1), fmt(r.get("p99_tpot_ms"), 1),
                  fmt(r.get("p99_e2e_latency_ms"), 1), fmt(r.get("accept_length")), str(r.get("failed")))
    console.print(t)


def render_compare(console: Console, rows: Sequence[CompareRow], label_a: str, label_b: str) -> None:
    t = Table(title=f"Compare  A={label_a}  B={label_b}", box=_box(console), title_justify="left")
    for c in ("metric", "A", "B", "B-A", "change"):
        t.add_column(c, justify="left" if c == "metric" else "right")
    for row in rows:
        pct = "n/a" if row.pct is None else f"{row.pct:+.1f}%"
        change = Text(pct)  # Text, never markup: labels and values are the user's
        if row.verdict == "better":
            change = Text(f"{pct} better", style="green" if console.is_terminal else "")
        elif row.verdict == "worse":
            change = Text(f"{pct} worse", style="red" if console.is_terminal else "")
        t.add_row(row.field, fmt(row.a), fmt(row.b), fmt(row.delta), change)
    console.print(t)


def _pct(fraction: float | None) -> float | None:
    return None if fraction is None else 100.0 * fraction
