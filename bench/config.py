"""What one `specctl bench` invocation asks for: frozen config dataclasses and the option parsers.

`BenchConfig` is the whole resolved request (target, workload, load, SLOs, output); `LoadPoint` is one
point of a sweep (one request rate x one max concurrency). Parsers turn CLI strings ("1,2,4", "inf",
"ttft=0.4,tpot=0.04") into values and raise `UsageError` naming the option on bad input.
"""

from __future__ import annotations

import dataclasses
import json
import math
from collections.abc import Sequence
from typing import Any

from specctl.errors import UsageError

DATASETS = ("random", "jsonl", "sharegpt", "shared-prefix", "code")
ENDPOINTS = {"completions": "/v1/completions", "chat": "/v1/chat/completions"}
SLO_KEYS = ("ttft", "tpot", "e2e")


@dataclasses.dataclass(frozen=True)
class WorkloadConfig:
    """Which prompts to send. Lengths are in tokens of a byte-level tokenizer (= bytes of ASCII text)."""

    dataset_name: str = "random"
    dataset_path: str | None = None
    num_prompts: int = 100
    random_input_len: int = 128
    random_output_len: int = 64
    random_range_ratio: float = 1.0
    sharegpt_output_len: int | None = None
    gsp_num_groups: int = 4
    gsp_prompts_per_group: int = 8
    gsp_system_prompt_len: int = 256
    gsp_question_len: int = 32
    gsp_output_len: int = 64
    seed: int = 1


@dataclasses.dataclass(frozen=True)
class LoadPoint:
    """One point of a sweep. request_rate inf = send as fast as allowed; max_concurrency None = unbounded."""

    request_rate: float = math.inf
    max_concurrency: int | None = None

    @property
    def open_loop(self) -> bool:
        # A finite rate means arrivals follow a schedule regardless of responses (open loop); with an
        # infinite rate and a concurrency cap, each finished request starts the next (closed loop).
        return math.isfinite(self.request_rate)

    def label(self) -> str:
        rate = "inf" if not math.isfinite(self.request_rate) else f"{self.request_rate:g}"
        conc = "-" if self.max_concurrency is None else str(self.max_concurrency)
        return f"rate={rate} conc={conc}"


@dataclasses.dataclass(frozen=True)
class BenchConfig:
    """The whole resolved bench request. `points` is the sweep (one entry for a single run)."""

    url: str = ""
    endpoint: str = "completions"
    model: str | None = None
    workload: WorkloadConfig = WorkloadConfig()
    points: tuple[LoadPoint, ...] = (LoadPoint(),)
    burstiness: float = 1.0
    duration_s: float | None = None
    warmup_requests: int = 1
    request_timeout_s: float = 300.0
    slo: dict[str, float] = dataclasses.field(default_factory=dict)
    stream: bool = True
    ignore_eos: bool = True
    temperature: float = 0.0
    extra_request_body: dict[str, Any] = dataclasses.field(default_factory=dict)
    tag: str | None = None
    output_details: bool = False
    # Append each request's speculative statistics (asked for with `return_spec_tokens_details`) to this
    # file as trace request lines (adaptive/sglang_trace.py), for `specctl adaptive tune`.
    spec_trace_out: str | None = None
    spec_trace_steps: int | None = None  # the launched engines' --trace-steps: every verify drafted it

    @property
    def api_path(self) -> str:
        return ENDPOINTS[self.endpoint]

    def to_json(self) -> dict[str, Any]:
        """The resolved config as plain JSON (infinite rates as the string "inf")."""
        out = dataclasses.asdict(self)
        out["points"] = [
            {"request_rate": _json_rate(p.request_rate), "max_concurrency": p.max_concurrency} for p in self.points
        ]
        return out


def _json_rate(rate: float) -> float | str:
    return rate if math.isfinite(rate) else "inf"


def parse_rates(text: str) -> list[float]:
    """'1,2,4' -> [1.0, 2.0, 4.0]; 'inf' -> [inf]. Rates must be > 0."""
    out: list[float] = []
    for part in _split(text, "--request-rate"):
        try:
            value = float(part)
        except ValueError:
            raise UsageError(f"--request-rate: {part!r} is not a number",
                             hint="e.g. --request-rate 4 or 1,2,4 or inf") from None
        if not value > 0:
            raise UsageError(f"--request-rate: {part!r} must be > 0")
        out.append(value)
    return out


def parse_concurrencies(text: str | None) -> list[int | None]:
    """'1,4,16' -> [1, 4, 16]; None -> [None] (unbounded)."""
    if text is None or not text.strip():
        return [None]
    out: list[int | None] = []
    for part in _split(text, "--max-concurrency"):
        if not part.isdigit() or int(part) < 1:
            raise UsageError(f"--max-concurrency: {part!r} is not a positive integer", hint="e.g. 1,4,16")
        out.append(int(part))
    return out


def sweep_points(rates: Sequence[float], concurrencies: Sequence[int | None]) -> tuple[LoadPoint, ...]:
    """Every (rate, concurrency) combination, rates outermost, in the order given."""
    return tuple(LoadPoint(r, c) for r in rates for c in concurrencies)


def parse_slo(text: str | None) -> dict[str, float]:
    """'ttft=0.4,tpot=0.04' (seconds; a 'ms' suffix is accepted) -> {'ttft': 0.4, 'tpot': 0.04}."""
    if not text:
        return {}
    out: dict[str, float] = {}
    for part in _split(text, "--slo"):
        key, sep, raw = part.partition("=")
        key = key.strip().lower()
        if not sep or key not in SLO_KEYS:
            raise UsageError(f"--slo: {part!r} is not KEY=SECONDS with KEY one of {', '.join(SLO_KEYS)}",
                             hint="e.g. --slo ttft=0.4,tpot=0.04")
        raw = raw.strip().lower()
        scale = 1.0
        if raw.endswith("ms"):
            raw, scale = raw[:-2], 1e-3
        elif raw.endswith("s"):
            raw = raw[:-1]
        try:
            value = float(raw) * scale
        except ValueError:
            raise UsageError(f"--slo: {part!r}: {raw!r} is not a number of seconds") from None
        if not value > 0:
            raise UsageError(f"--slo: {part!r} must be > 0")
        out[key] = value
    return out


def parse_extra_body(text: str | None) -> dict[str, Any]:
    if not text:
        return {}
    try:
        value = json.loads(text)
    except json.JSONDecodeError as exc:
        raise UsageError(f"--extra-request-body is not JSON: {exc}") from None
    if not isinstance(value, dict):
        raise UsageError("--extra-request-body must be a JSON object")
    return value


def _split(text: str, option: str) -> list[str]:
    parts = [p.strip() for p in text.split(",") if p.strip()]
    if not parts:
        raise UsageError(f"{option}: empty value")
    return parts
