"""`specctl bench --ab`: the same workload against a base and its variants, interleaved in rounds.

Contract:

- Variants: with `-c DEPLOY`, the base is the deployment (with its `--set`s) and each `--ab
  KEY=VALUE[;KEY=VALUE...]` adds one variant with those overrides on top; every variant is launched
  side by side on this machine (each role's ports moved to free ones) before the first request, so
  all share the machine for the whole run. With `--url A --ab-url B` the servers are given.
- Rounds: the workload (`--num-prompts`) is split into `rounds` equal chunks; round r sends chunk r
  (its own seed) to every variant, one variant after another, the order rotated each round, so load
  drift on a shared machine hits every variant alike and no two variants compete for the CPU.
- Per variant the rounds' requests are merged into one record (the usual bench record, throughputs over
  the summed round durations) with `ab` added: its name, overrides and round figures.
- The comparison: per variant and metric (output throughput, mean TTFT, mean TPOT, accept length) the
  ratio to the base with a 95% percentile bootstrap interval over rounds (paired: a resample picks the
  same rounds for both sides, and a ratio of sums is taken), `AB_BOOTSTRAP` resamples, fixed seed.
- Filled share (closed loop, `--max-concurrency C`): the part of a variant's measured time during which
  C requests were in flight. Every round starts with C first prompts and nothing to decode and ends
  with its last requests decoding at a falling batch size, so small rounds weigh start-up and drain as
  much as steady serving: on tiny-pd at C = 4 (code), speculation measured 1.28-1.36x no speculation in
  rounds of 8 prompts (filled 75-88% of the time) and 1.49-1.53x in rounds of 40 (filled 95-96%). Below
  `FILLED_WARN` the report says so and how to fix it.
"""

from __future__ import annotations

import dataclasses
import math
import random
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from specctl.bench.config import BenchConfig, LoadPoint
from specctl.bench.load import LoadResult
from specctl.bench.record import json_safe
from specctl.bench.runner import PointRun, ProgressSink, Provenance, build_record, run_bench
from specctl.errors import UsageError
from specctl.orchestrate.ports import free_port

if TYPE_CHECKING:
    from rich.console import Console

AB_BOOTSTRAP = 2000
FILLED_WARN = 0.9  # a variant full for less of its measured time than this gets a note in the report
METRICS = ("output_throughput", "mean_ttft_ms", "mean_tpot_ms", "accept_length")
HIGHER_IS_BETTER = {"output_throughput": True, "mean_ttft_ms": False, "mean_tpot_ms": False, "accept_length": True}


@dataclasses.dataclass(frozen=True)
class Variant:
    name: str  # "base", or the --ab text
    overrides: tuple[str, ...] = ()
    url: str = ""
    provenance: Provenance = Provenance()


def parse_ab(values: Sequence[str]) -> list[tuple[str, ...]]:
    """Each `--ab` value -> its overrides (`KEY=VALUE`, several separated by ';')."""
    out = []
    for text in values:
        parts = tuple(p.strip() for p in text.split(";") if p.strip())
        bad = [p for p in parts if "=" not in p or not p.split("=", 1)[0].strip()]
        if not parts or bad:
            raise UsageError(f"--ab {text!r}: expected KEY=VALUE (several: KEY=VALUE;KEY=VALUE)",
                             hint="e.g. --ab speculative.algorithm=none --ab speculative.num_steps=5")
        out.append(parts)
    return out


def port_overrides(raw: object) -> list[str]:
    """`roles.R.KEY=PORT` with a free port for every `port` / `*_port` field of every role, so a copy of
    the deployment can run next to the original."""
    roles = raw.get("roles") if isinstance(raw, dict) else None
    out: list[str] = []
    if not isinstance(roles, dict):
        return out
    taken: set[int] = set()
    for role, body in roles.items():
        if not isinstance(body, dict):
            continue
        for key, value in body.items():
            if (key == "port" or key.endswith("_port")) and isinstance(value, int) and not isinstance(value, bool):
                port = free_port(taken=taken)  # below the ephemeral range: see orchestrate/ports.py
                taken.add(port)
                out.append(f"roles.{role}.{key}={port}")
    return out


@dataclasses.dataclass
class VariantRun:
    variant: Variant
    rounds: list[PointRun] = dataclasses.field(default_factory=list)
    record: dict[str, Any] = dataclasses.field(default_factory=dict)
    merged: PointRun | None = None  # all rounds as one run (for the plot)


def _round_config(cfg: BenchConfig, url: str, r: int, per_round: int, first: bool) -> BenchConfig:
    workload = dataclasses.replace(cfg.workload, num_prompts=per_round, seed=cfg.workload.seed + r)
    return dataclasses.replace(cfg, url=url, workload=workload, warmup_requests=cfg.warmup_requests if first else 0)


def run_ab(cfg: BenchConfig, variants: Sequence[Variant], *, rounds: int,
           progress: ProgressSink | None = None) -> list[VariantRun]:
    """Interleave `rounds` rounds over `variants` (the first is the base) and build their records."""
    if len(cfg.points) != 1:
        raise UsageError("--ab compares one load point: give a single --request-rate / --max-concurrency")
    if rounds < 1:
        raise UsageError("--ab-rounds must be >= 1")
    per_round = max(1, math.ceil(cfg.workload.num_prompts / rounds))
    runs = [VariantRun(v) for v in variants]
    for r in range(rounds):
        shift = r % len(runs)
        for run in runs[shift:] + runs[:shift]:
            rc = _round_config(cfg, run.variant.url, r, per_round, first=not run.rounds)
            run.rounds.extend(run_bench(rc, progress=progress, provenance=run.variant.provenance))
    for run in runs:
        run.record = merged_record(cfg, run)
    return runs


def merged_record(cfg: BenchConfig, run: VariantRun) -> dict[str, Any]:
    """One bench record over all of a variant's rounds (throughputs over the summed durations)."""
    first, last = run.rounds[0], run.rounds[-1]
    results = [res for pr in run.rounds for res in pr.load.results]
    total = sum(pr.load.duration for pr in run.rounds)
    start = first.load.start
    merged = LoadResult(point=first.load.point, results=results, start=start, wall_start=first.load.wall_start,
                        mono_start=first.load.mono_start, end=start + total)
    run.merged = PointRun(merged, first.before, last.after, {})
    model = str(first.record.get("model") or "default")
    rc = dataclasses.replace(cfg, url=run.variant.url)
    rec = build_record(rc, model, merged, first.before, last.after, run.variant.provenance)
    run.merged.record = rec
    rec["ab"] = {
        "variant": run.variant.name,
        "overrides": list(run.variant.overrides),
        "rounds": [{m: pr.record.get(m) for m in ("duration", "completed", "total_output_tokens", *METRICS)}
                   for pr in run.rounds],
    }
    safe: dict[str, Any] = json_safe(rec)
    return safe


def _round_sums(run: VariantRun) -> list[dict[str, float]]:
    """Per round the sums the ratios are built from (so a resample's ratio is a ratio of sums)."""
    out = []
    for pr in run.rounds:
        ok = [x for x in pr.load.results if x.ok]
        ttft = [t for x in ok if (t := x.ttft) is not None]
        tpot = [t for x in ok if (t := x.tpot) is not None]
        acc = pr.record.get("accept_length")
        out.append({
            "tokens": float(sum(x.output_tokens for x in ok)), "duration": pr.load.duration,
            "ttft_sum": float(sum(ttft)), "ttft_n": float(len(ttft)),
            "tpot_sum": float(sum(tpot)), "tpot_n": float(len(tpot)),
            "acc": float(acc) if isinstance(acc, (int, float)) else math.nan,
        })
    return out


def _metric(rows: Sequence[dict[str, float]], metric: str) -> float:
    if metric == "output_throughput":
        d = sum(r["duration"] for r in rows)
        return sum(r["tokens"] for r in rows) / d if d > 0 else math.nan
    if metric in ("mean_ttft_ms", "mean_tpot_ms"):
        key = metric.split("_")[1]
        n = sum(r[f"{key}_n"] for r in rows)
        return 1000.0 * sum(r[f"{key}_sum"] for r in rows) / n if n else math.nan
    vals = [r["acc"] for r in rows if not math.isnan(r["acc"])]
    return sum(vals) / len(vals) if vals else math.nan


def bootstrap_ratio(base: Sequence[dict[str, float]], other: Sequence[dict[str, float]], metric: str,
                    *, resamples: int = AB_BOOTSTRAP, seed: int = 0) -> tuple[float, float, float]:
    """(ratio other/base, 2.5th, 97.5th percentile) of the metric, rounds resampled in pairs."""
    n = min(len(base), len(other))
    point = _metric(other, metric) / _metric(base, metric)
    if n < 2 or math.isnan(point):
        return point, math.nan, math.nan
    rng = random.Random(seed)
    ratios = []
    for _ in range(resamples):
        idx = [rng.randrange(n) for _ in range(n)]
        b = _metric([base[i] for i in idx], metric)
        o = _metric([other[i] for i in idx], metric)
        if b and not math.isnan(b) and not math.isnan(o):
            ratios.append(o / b)
    if not ratios:
        return point, math.nan, math.nan
    ratios.sort()
    return point, ratios[int(0.025 * (len(ratios) - 1))], ratios[int(0.975 * (len(ratios) - 1))]


def filled_seconds(load: LoadResult, cap: int) -> float:
    """Seconds of `load`'s run during which at least `cap` requests were in flight (sent, not yet ended)."""
    events: list[tuple[float, int]] = []
    for res in load.results:
        if res.end is not None and res.end > res.sent:
            events += [(res.sent, 1), (res.end, -1)]
    events.sort()  # at equal times an end (-1) sorts first: a request ending as the next starts is no overlap
    filled, active, since = 0.0, 0, 0.0
    for t, step in events:
        if active >= cap:
            filled += t - since
        active += step
        since = t
    return filled


def filled_share(run: VariantRun) -> float | None:
    """The share of `run`'s measured time (all rounds) with --max-concurrency requests in flight; None for
    an open-loop or uncapped load, where no fill level is asked for."""
    total = filled = 0.0
    for pr in run.rounds:
        cap = pr.load.point.max_concurrency
        if cap is None or not math.isinf(pr.load.point.request_rate):
            return None
        total += pr.load.duration
        filled += filled_seconds(pr.load, cap)
    return filled / total if total > 0 else None


def comparison(runs: Sequence[VariantRun]) -> dict[str, Any]:
    """The comparison record: every variant's metrics and its ratios to the base (first run)."""
    base = _round_sums(runs[0])
    rows = []
    for run in runs:
        sums = _round_sums(run)
        row: dict[str, Any] = {"variant": run.variant.name, "overrides": list(run.variant.overrides),
                               "url": run.variant.url, "rounds": len(run.rounds),
                               "prompts_per_round": len(run.rounds[0].load.results) if run.rounds else 0,
                               "filled_share": filled_share(run)}
        for m in METRICS:
            row[m] = _metric(sums, m)
            if run is not runs[0]:
                ratio, lo, hi = bootstrap_ratio(base, sums, m)
                row[f"{m}_ratio"] = {"ratio": ratio, "ci95": [lo, hi]}
        rows.append(row)
    out: dict[str, Any] = json_safe({"kind": "ab-comparison", "base": runs[0].variant.name,
                                     "metrics": list(METRICS), "bootstrap_resamples": AB_BOOTSTRAP, "variants": rows})
    return out


@dataclasses.dataclass(frozen=True)
class _NamedPoint(LoadPoint):
    """A load point that labels itself with the variant's name (the plot's legend)."""

    name: str = ""

    def label(self) -> str:
        return self.name


def plot_runs(runs: Sequence[VariantRun]) -> list[PointRun]:
    """One merged PointRun per variant, labelled by variant, for `bench.plot.write_plot` to overlay."""
    out = []
    for run in runs:
        if run.merged is None:
            continue
        point = run.merged.load.point
        named = _NamedPoint(point.request_rate, point.max_concurrency, name=run.variant.name)
        load = dataclasses.replace(run.merged.load, point=named)
        out.append(PointRun(load, run.merged.before, run.merged.after, run.merged.record))
    return out


def _fmt(v: object) -> str:
    return f"{v:.2f}" if isinstance(v, (int, float)) and math.isfinite(v) else "-"


def render_comparison(console: Console, comp: dict[str, Any]) -> None:
    """Each variant's figures, then its ratios to the base with 95% intervals, then the base's speed-up."""
    from rich.table import Table  # noqa: PLC0415 - rich: only when the A/B table is printed

    labels = ("output tok/s", "mean TTFT ms", "mean TPOT ms", "accept length")
    values = Table(title="A/B: per variant (all rounds)")
    ratios = Table(title=f"A/B: ratio to {comp['base']} [95% bootstrap CI over rounds]")
    values.add_column("variant")
    ratios.add_column("variant")
    for label in labels:
        values.add_column(label, justify="right")
        ratios.add_column(label, justify="right")
    for row in comp["variants"]:
        values.add_row(row["variant"], *(_fmt(row.get(m)) for m in METRICS))
        if row["variant"] == comp["base"] and "output_throughput_ratio" not in row:
            continue
        cells = []
        for m in METRICS:
            r = row.get(f"{m}_ratio") or {}
            lo, hi = (r.get("ci95") or [None, None])[:2]
            ok = isinstance(r.get("ratio"), (int, float))
            cells.append(f"{_fmt(r.get('ratio'))}x [{_fmt(lo)}, {_fmt(hi)}]" if ok else "-")
        ratios.add_row(row["variant"], *cells)
    console.print(values)
    console.print(ratios)
    for row in comp["variants"][1:]:
        r = row.get("output_throughput_ratio") or {}
        ratio, (lo, hi) = r.get("ratio"), (r.get("ci95") or [None, None])[:2]
        if isinstance(ratio, (int, float)) and ratio > 0:
            inv = [1 / x if isinstance(x, (int, float)) and x > 0 else None for x in (hi, lo)]
            console.print(f"{comp['base']} is {1 / ratio:.2f}x the output throughput of {row['variant']} "
                          f"(95% CI {_fmt(inv[0])}-{_fmt(inv[1])})", markup=False, highlight=False)
    shares = [(row["variant"], row["filled_share"]) for row in comp["variants"]
              if isinstance(row.get("filled_share"), (int, float))]
    low = [(name, share) for name, share in shares if share < FILLED_WARN]
    if low:
        per_round = comp["variants"][0].get("prompts_per_round")
        which = ", ".join(f"{name} {share:.0%}" for name, share in low)
        console.print(f"note: --max-concurrency requests were in flight for only part of the measured time ({which}): "
                      f"each round of {per_round} prompts starts with nothing to decode and drains at a falling batch "
                      "size, and small rounds weigh that as much as steady serving. For the steady-state ratio give "
                      "more --num-prompts per --ab-rounds (about 10x --max-concurrency per round).",
                      markup=False, highlight=False)
