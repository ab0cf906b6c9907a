"""Prometheus text exposition: parse a `/metrics` scrape and diff two scrapes.

Only what a before/after report needs: samples keyed by `name{labels}` (labels as written), the
declared `# TYPE`s, and `metrics_delta(before, after)`: counters (declared `counter`, or named
`*_total`, `*_count`, `*_sum`, `*_bucket`) as after - before where they moved; gauges as their value
after the run. Malformed lines are skipped, never fatal: the scrape is a best-effort extra.
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
