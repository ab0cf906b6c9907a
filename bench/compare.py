"""Comparing two bench records field by field: B - A, the relative change, and which way is better.

Fields compared are the headline ones (`COMPARE_FIELDS`): throughputs (higher is better), latency
statistics (lower is better), acceptance (higher is better), failures (lower is better). A field
missing or non-numeric on either side gets no delta. `pick(records, index)` selects the run to
compare from a JSONL file (default: the last).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

from specctl.errors import UsageError

HIGHER_BETTER = ("request_throughput", "output_throughput", "input_throughput", "total_throughput", "goodput",
                 "achieved_request_rate", "accept_length", "completed")
LOWER_BETTER = ("failed",
                "mean_ttft_ms", "median_ttft_ms", "p90_ttft_ms", "p99_ttft_ms",
                "mean_tpot_ms", "median_tpot_ms", "p99_tpot_ms",
                "mean_itl_ms", "median_itl_ms", "p99_itl_ms",
                "mean_e2e_latency_ms", "median_e2e_latency_ms", "p99_e2e_latency_ms")
COMPARE_FIELDS = ("completed", "failed", "request_throughput", "output_throughput", "input_throughput",
                  "goodput", "accept_length", "achieved_request_rate",
                  "mean_ttft_ms", "median_ttft_ms", "p99_ttft_ms", "mean_tpot_ms", "median_tpot_ms", "p99_tpot_ms",
                  "mean_itl_ms", "p99_itl_ms", "mean_e2e_latency_ms", "median_e2e_latency_ms", "p99_e2e_latency_ms")


@dataclasses.dataclass(frozen=True)
class CompareRow:
    field: str
    a: float | None
    b: float | None
    delta: float | None
    pct: float | None
    verdict: str | None  # "better" | "worse" | "same" | None

    def to_json(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def pick(records: Sequence[dict[str, Any]], index: int, name: str) -> dict[str, Any]:
    try:
        return records[index]
    except IndexError:
        raise UsageError(f"{name} has {len(records)} record(s); --index {index} is out of range") from None


def _num(value: object) -> float | None:
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None


def compare_records(a: dict[str, Any], b: dict[str, Any]) -> list[CompareRow]:
    rows = []
    for field in COMPARE_FIELDS:
        va, vb = _num(a.get(field)), _num(b.get(field))
        delta = pct = verdict = None
        if va is not None and vb is not None:
            delta = vb - va
            pct = 100.0 * delta / abs(va) if va != 0 else None
            if delta == 0:
                verdict = "same"
            elif field in HIGHER_BETTER:
                verdict = "better" if delta > 0 else "worse"
            elif field in LOWER_BETTER:
                verdict = "better" if delta < 0 else "worse"
        rows.append(CompareRow(field, va, vb, delta, pct, verdict))
    return rows
