"""Prometheus text exposition: parse a `/metrics` scrape and diff two scrapes.

Only what a before/after report needs: samples keyed by `name{labels}` (labels as written), the
declared `# TYPE`s, and `metrics_delta(before, after)`: counters (declared `counter`, or named
`*_total`, `*_count`, `*_sum`, `*_bucket`) as after - before where they moved; gauges as their value
after the run. Malformed lines are skipped, never fatal: the scrape is a best-effort extra.

`sglang_metrics(text)` reads SGLang's own gauges (`srt/observability/metrics_collector.py`: one
series per TP/PP/DP rank, labelled `model_name`, `engine_type`, `tp_rank` ...) into one value
each: queue and running counts and throughput summed over ranks, ratios (`spec_accept_length`,
`spec_accept_rate`, `token_usage` ...) averaged over the ranks that report them.
"""

from __future__ import annotations

import math
import re
from typing import Any

_SAMPLE = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{[^}]*\})?\s+(\S+)(?:\s+\S+)?\s*$")
_COUNTER_SUFFIXES = ("_total", "_count", "_sum", "_bucket")


def parse_metrics(text: str) -> tuple[dict[str, float], dict[str, str]]:
    """(samples, types): samples maps 'name{labels}' to its value; types maps a metric name to its TYPE."""
    samples: dict[str, float] = {}
    types: dict[str, str] = {}
    for line in text.splitlines():
        line = line.strip()
        if not line:
            continue
        if line.startswith("#"):
            parts = line.split()
            if len(parts) >= 4 and parts[1] == "TYPE":
                types[parts[2]] = parts[3]
            continue
        m = _SAMPLE.match(line)
        if not m:
            continue
        try:
            value = float(m.group(3))
        except ValueError:
            continue
        samples[m.group(1) + (m.group(2) or "")] = value
    return samples, types


def _base_name(key: str) -> str:
    return key.split("{", 1)[0]


def _is_counter(name: str, types: dict[str, str]) -> bool:
    for family, kind in types.items():
        if name == family or (name.startswith(family) and name[len(family):] in _COUNTER_SUFFIXES):
            return kind in ("counter", "histogram", "summary") and not (kind == "summary" and name == family)
    return name.endswith(_COUNTER_SUFFIXES)


def metrics_delta(before: str | None, after: str | None, *, limit: int = 200) -> dict[str, Any] | None:
    """{'counters': {series: delta}, 'gauges': {series: value_after}} or None without an after-scrape."""
    if after is None:
        return None
    a_samples, a_types = parse_metrics(after)
    b_samples, b_types = parse_metrics(before or "")
    types = {**b_types, **a_types}
    counters: dict[str, float] = {}
    gauges: dict[str, float] = {}
    for key, value in a_samples.items():
        if not math.isfinite(value):
            continue
        if _is_counter(_base_name(key), types):
            delta = value - b_samples.get(key, 0.0)
            if delta != 0 and len(counters) < limit:
                counters[key] = delta
        elif len(gauges) < limit:
            gauges[key] = value
    return {"counters": counters, "gauges": gauges}


# SGLang gauge -> how its per-rank series combine into one number.
SGLANG_GAUGES: dict[str, str] = {
    "sglang:num_running_reqs": "sum",
    "sglang:num_queue_reqs": "sum",
    "sglang:gen_throughput": "sum",
    "sglang:num_prefill_bootstrap_queue_reqs": "sum",
    "sglang:num_prefill_inflight_queue_reqs": "sum",
    "sglang:num_decode_prealloc_queue_reqs": "sum",
    "sglang:num_decode_transfer_queue_reqs": "sum",
    "sglang:spec_accept_length": "mean",
    "sglang:spec_accept_rate": "mean",
    "sglang:spec_num_steps": "mean",
    "sglang:token_usage": "mean",
    "sglang:cache_hit_rate": "mean",
}


def sglang_metrics(text: str | None) -> dict[str, float] | None:
    """{'num_running_reqs': ..., 'spec_accept_length': ...} from SGLang's gauges in one scrape (names
    without the `sglang:` prefix); None when the scrape has no SGLang gauge (not an SGLang server)."""
    if not text:
        return None
    samples, _ = parse_metrics(text)
    values: dict[str, list[float]] = {}
    for key, value in samples.items():
        name = _base_name(key)
        if name in SGLANG_GAUGES and math.isfinite(value):
            values.setdefault(name, []).append(value)
    if not values:
        return None
    out: dict[str, float] = {}
    for name, vs in values.items():
        out[name.removeprefix("sglang:")] = sum(vs) if SGLANG_GAUGES[name] == "sum" else sum(vs) / len(vs)
    return out


def spec_accept_length(text: str | None) -> float | None:
    """SGLang's `sglang:spec_accept_length` gauge (mean over ranks): the latest logging window's mean
    accepted drafts + 1 per verify; None without it. Ranks that never speculated report 0: skipped."""
    if not text:
        return None
    samples, _ = parse_metrics(text)
    vs = [v for k, v in samples.items() if _base_name(k) == "sglang:spec_accept_length" and v > 0
          and math.isfinite(v)]
    return sum(vs) / len(vs) if vs else None
