"""Metrics of one sweep point from its request results: latency, throughput, goodput, errors.

Field names follow SGLang's bench_serving where it has one (`request_throughput`, `mean_ttft_ms`,
`p99_itl_ms`, `completed`, `total_input_tokens`, ...); every latency family (ttft, tpot, itl per token,
e2e_latency, and chunk_gap: the raw gap between stream chunks) gets mean, median, p90, p95, p99, std and max in
milliseconds (numpy's linear
percentiles, as bench_serving). Latencies are from the scheduled send time (see `request`).

- `duration`: from the schedule's origin to the last response; throughputs divide by it.
- `achieved_request_rate`: (sends - 1) / (last send - first send), the pacing the client achieved;
  `scheduled_request_rate` the same over scheduled times (equal to the target in open loop).
- goodput: requests that succeeded and met every SLO (`ttft`, `tpot`, `e2e`, seconds), per second;
  a request with one output token has no TPOT and passes that SLO.
- errors: counts by kind, plus one example message per kind.
- `ttft_breakdown`: server-reported per-request `timings` (keys ending `_ms` or `_s`) summarised per
  component, plus `unattributed_ms` = TTFT minus the TTFT-phase components (`TTFT_PHASES`), i.e.
  network, router and client time.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from typing import Any

import numpy as np

from specctl.bench.load import LoadResult
from specctl.bench.request import RequestResult

STATS = ("mean", "median", "p90", "p95", "p99", "std", "max")
FAMILIES = ("ttft", "tpot", "itl", "e2e_latency")
# Server-side phases that together make up TTFT in a disaggregated deployment.
TTFT_PHASES = ("queue", "prefill_queue", "prefill", "prefill_compute", "transfer", "decode_queue")
# (specctl's PD servers report prefill_queue_s, prefill_s, transfer_s, decode_queue_s; `prefill_wait`
# spans several of them and `ttft`/`decode`/`*_total` are other views, so none of those is subtracted.)


def stats_ms(values_s: Sequence[float]) -> dict[str, float | None]:
    """{mean, median, p90, p95, p99, std, max} in ms of values in seconds (None for no values)."""
    if not len(values_s):
        return dict.fromkeys(STATS)
    a = np.asarray(values_s, dtype=float) * 1000.0
    return {"mean": float(a.mean()), "median": float(np.median(a)), "p90": float(np.percentile(a, 90)),
            "p95": float(np.percentile(a, 95)), "p99": float(np.percentile(a, 99)), "std": float(a.std()),
            "max": float(a.max())}


def summarize_load(load: LoadResult, slo: dict[str, float]) -> dict[str, Any]:
    results = load.results
    ok = [r for r in results if r.ok]
    dur = load.duration
    out: dict[str, Any] = {"duration": dur, "num_requests": len(results), "completed": len(ok),
                           "failed": len(results) - len(ok)}
    total_in = sum(r.prompt_tokens for r in ok)
    total_out = sum(r.output_tokens for r in ok)
    out.update(total_input_tokens=total_in, total_output_tokens=total_out,
               request_throughput=len(ok) / dur, input_throughput=total_in / dur,
               output_throughput=total_out / dur, total_throughput=(total_in + total_out) / dur)
    families = {
        "ttft": [r.ttft for r in ok if r.ttft is not None],
        "tpot": [t for r in ok if (t := r.tpot) is not None],
        "itl": [x for r in ok for x in r.itl],
        "e2e_latency": [r.e2e for r in ok if r.e2e is not None],
        # the raw gap between chunks, whatever each held (ITL above is per token)
        "chunk_gap": [x for r in ok for x in r.chunk_gaps],
    }
    for family, values in families.items():
        for stat, value in stats_ms(values).items():
            out[f"{stat}_{family}_ms"] = value
    out["concurrency"] = sum(families["e2e_latency"]) / dur
    send = stats_ms([r.send_delay for r in results if r.sent])
    out["mean_send_delay_ms"], out["p99_send_delay_ms"], out["max_send_delay_ms"] = (
        send["mean"], send["p99"], send["max"])
    out["achieved_request_rate"] = _rate([r.sent for r in results if r.sent])
    out["scheduled_request_rate"] = _rate([r.scheduled for r in results])
    out.update(_goodput(results, slo, dur))
    kinds = Counter(r.error_kind for r in results if r.error_kind)
    out["errors"] = dict(sorted(kinds.items()))
    examples: dict[str, str] = {}
    for r in results:
        if r.error_kind and r.error_kind not in examples:
            examples[r.error_kind] = r.error
    out["error_examples"] = examples
    out["ttft_breakdown"] = ttft_breakdown(ok)
    return out


def _rate(times: Sequence[float]) -> float | None:
    if len(times) < 2:
        return None
    span = max(times) - min(times)
    return (len(times) - 1) / span if span > 0 else None


def _goodput(results: Sequence[RequestResult], slo: dict[str, float], dur: float) -> dict[str, Any]:
    if not slo:
        return {"slo": None, "goodput": None, "goodput_fraction": None}
    good = 0
    for r in results:
        if not r.ok:
            continue
        checks = {"ttft": r.ttft, "tpot": r.tpot, "e2e": r.e2e}
        if all((v := checks[k]) is None or v <= limit for k, limit in slo.items()):
            good += 1
    return {"slo": dict(slo), "goodput": good / dur, "goodput_fraction": good / len(results) if results else None}


def _timing_ms(timings: dict[str, Any]) -> dict[str, float]:
    out = {}
    for key, value in timings.items():
        if not isinstance(value, (int, float)) or isinstance(value, bool):
            continue
        if key.endswith("_ms"):
            out[key[:-3]] = float(value)
        elif key.endswith("_s"):
            out[key[:-2]] = float(value) * 1000.0
    return out


def ttft_breakdown(ok: Sequence[RequestResult]) -> dict[str, dict[str, float | None]] | None:
    """Per-component {mean, median, p99} (ms) of server-reported timings; None when no server reports any."""
    per_component: dict[str, list[float]] = {}
    unattributed: list[float] = []
    for r in ok:
        if not r.timings or r.ttft is None:
            continue
        comps = _timing_ms(r.timings)
        for name, ms in comps.items():
            per_component.setdefault(name, []).append(ms / 1000.0)
        phases = [ms for name, ms in comps.items() if name in TTFT_PHASES]
        if phases:
            unattributed.append(r.ttft - sum(phases) / 1000.0)
    if not per_component:
        return None
    if unattributed:
        per_component["unattributed"] = unattributed
    # TTFT phases first, in pipeline order, then everything else the server reported.
    order = [*TTFT_PHASES, "unattributed"]
    names = sorted(per_component, key=lambda n: (order.index(n) if n in order else len(order), n))
    out = {}
    for name in names:
        values = per_component[name]
        s = stats_ms(values)
        out[f"{name}_ms"] = {"mean": s["mean"], "median": s["median"], "p99": s["p99"]}
    return out
