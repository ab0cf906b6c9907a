"""Prometheus text-format metrics: counters, gauges and histograms with labels, no dependency.

Contract: `Registry.render()` returns the Prometheus text exposition format (version 0.0.4) of every
metric registered on it, each series carrying the registry's constant labels (`model_name`, as vLLM
and SGLang label theirs). Metric objects are thread-safe (the engine thread and the asyncio thread both
record). Names follow Prometheus conventions: `_total` only on counters, base units (seconds, bytes),
`_ratio` for 0-1 gauges. docs/metrics.md maps them to SGLang's and vLLM's names.

Each role counts what it does: the front (colocated, router) requests, TTFT, ITL and end-to-end
latency; prefill the prompts it computed, their prefill time and the transfers it sent; decode the
tokens it generated, their ITL, speculative acceptance and the transfers it received.
"""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Sequence

# Latency buckets (seconds) wide enough for tiny CPU models and real GPUs alike.
LATENCY_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)


def _label_text(names: Sequence[str], values: Sequence[str], extra: str = "",
                const: Sequence[tuple[str, str]] = ()) -> str:
    parts = [f'{n}="{_escape(v)}"' for n, v in (*const, *zip(names, values, strict=True))]
    if extra:
        parts.append(extra)
    return "{" + ",".join(parts) + "}" if parts else ""


def _escape(value: str) -> str:
    return str(value).replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def _fmt(value: float) -> str:
    if math.isinf(value):
        return "+Inf" if value > 0 else "-Inf"
    if float(value).is_integer():
        return str(int(value))
    return repr(float(value))


class _Metric:
    kind = "untyped"

    def __init__(self, name: str, help_text: str, labels: Sequence[str] = ()) -> None:
        self.name = name
        self.help = help_text
        self.label_names = tuple(labels)
        self._lock = threading.Lock()

    def _key(self, labels: dict[str, str]) -> tuple[str, ...]:
        return tuple(str(labels.get(n, "")) for n in self.label_names)

    def header(self) -> list[str]:
        return [f"# HELP {self.name} {self.help}", f"# TYPE {self.name} {self.kind}"]


class Counter(_Metric):
    kind = "counter"

    def __init__(self, name: str, help_text: str, labels: Sequence[str] = ()) -> None:
        super().__init__(name, help_text, labels)
        self._values: dict[tuple[str, ...], float] = {}

    def inc(self, amount: float = 1.0, **labels: str) -> None:
        key = self._key(labels)
        with self._lock:
            self._values[key] = self._values.get(key, 0.0) + amount

    def value(self, **labels: str) -> float:
        with self._lock:
            return self._values.get(self._key(labels), 0.0)

    def mirror(self, total: float, **labels: str) -> None:
        """Follow a monotone count kept elsewhere (raised to `total`, never lowered)."""
        key = self._key(labels)
        with self._lock:
            self._values[key] = max(self._values.get(key, 0.0), float(total))

    def render(self, const: Sequence[tuple[str, str]] = ()) -> list[str]:
        with self._lock:
            items = sorted(self._values.items())
        if not items and not self.label_names:
            items = [((), 0.0)]
        return self.header() + [f"{self.name}{_label_text(self.label_names, k, const=const)} {_fmt(v)}"
                                for k, v in items]


class Gauge(Counter):
    kind = "gauge"

    def set(self, value: float, **labels: str) -> None:
        key = self._key(labels)
        with self._lock:
            self._values[key] = float(value)

    def clear(self) -> None:
        with self._lock:
            self._values.clear()


class Histogram(_Metric):
    kind = "histogram"

    def __init__(
        self, name: str, help_text: str, labels: Sequence[str] = (), buckets: Sequence[float] = LATENCY_BUCKETS
    ) -> None:
        super().__init__(name, help_text, labels)
        self.buckets = tuple(sorted(buckets))
        self._counts: dict[tuple[str, ...], list[int]] = {}
        self._sums: dict[tuple[str, ...], float] = {}

    def observe(self, value: float, **labels: str) -> None:
        key = self._key(labels)
        with self._lock:
            counts = self._counts.setdefault(key, [0] * (len(self.buckets) + 1))
            for i, bound in enumerate(self.buckets):
                if value <= bound:
                    counts[i] += 1
            counts[-1] += 1  # +Inf bucket == count
            self._sums[key] = self._sums.get(key, 0.0) + value

    def count(self, **labels: str) -> int:
        with self._lock:
            counts = self._counts.get(self._key(labels))
            return counts[-1] if counts else 0

    def render(self, const: Sequence[tuple[str, str]] = ()) -> list[str]:
        with self._lock:
            items = sorted((k, list(v), self._sums[k]) for k, v in self._counts.items())
        if not items and not self.label_names:
            items = [((), [0] * (len(self.buckets) + 1), 0.0)]
        lines = self.header()
        names = self.label_names
        for key, counts, total in items:
            for bound, c in zip(self.buckets, counts[:-1], strict=True):
                le = f'le="{_fmt(bound)}"'
                lines.append(f"{self.name}_bucket{_label_text(names, key, le, const)} {c}")
            inf = 'le="+Inf"'
            lines.append(f"{self.name}_bucket{_label_text(names, key, inf, const)} {counts[-1]}")
            lines.append(f"{self.name}_sum{_label_text(names, key, const=const)} {_fmt(total)}")
            lines.append(f"{self.name}_count{_label_text(names, key, const=const)} {counts[-1]}")
        return lines


class Registry:
    """A named set of metrics; `render()` is the /metrics body."""

    def __init__(self) -> None:
        self._metrics: dict[str, _Metric] = {}
        self.const_labels: tuple[tuple[str, str], ...] = ()  # put on every series (model_name)

    def _add(self, metric: _Metric) -> _Metric:
        if metric.name in self._metrics:
            raise ValueError(f"metric {metric.name} registered twice")
        self._metrics[metric.name] = metric
        return metric

    def counter(self, name: str, help_text: str, labels: Sequence[str] = ()) -> Counter:
        return self._add(Counter(name, help_text, labels))  # type: ignore[return-value]

    def gauge(self, name: str, help_text: str, labels: Sequence[str] = ()) -> Gauge:
        return self._add(Gauge(name, help_text, labels))  # type: ignore[return-value]

    def histogram(
        self, name: str, help_text: str, labels: Sequence[str] = (), buckets: Sequence[float] = LATENCY_BUCKETS
    ) -> Histogram:
        return self._add(Histogram(name, help_text, labels, buckets))  # type: ignore[return-value]

    def render(self, *, skip: tuple[str, ...] = ()) -> str:
        """The exposition text; metric names starting with any of `skip` are left out (a router that
        mirrors them from prefill must not expose them twice)."""
        lines: list[str] = []
        for name, metric in self._metrics.items():
            if not (skip and name.startswith(skip)):
                lines.extend(metric.render(self.const_labels))  # type: ignore[attr-defined]
        return "\n".join(lines) + "\n"


def families(text: str, prefix: str) -> str:
    """The metric families of an exposition text whose names start with `prefix` (HELP/TYPE included)."""
    out = []
    for line in text.splitlines():
        name = line.split(" ", 3)[2] if line.startswith("# ") and len(line.split(" ", 3)) > 2 else line
        if name.startswith(prefix):
            out.append(line)
    return "\n".join(out) + ("\n" if out else "")


class ServingMetrics:
    """The metric set every specctl serving process exposes (names are part of the /metrics contract)."""

    def __init__(self) -> None:
        r = self.registry = Registry()
        self.requests = r.counter("specctl_requests_total", "Finished requests by outcome.", ["status"])
        self.prompt_tokens = r.counter("specctl_prompt_tokens_total", "Prompt tokens of finished requests.")
        self.generation_tokens = r.counter("specctl_generation_tokens_total", "Generated tokens.")
        self.running = r.gauge("specctl_requests_running", "Requests being served (the engine's running batch "
                               "where there is one, else HTTP requests in flight).")
        self.waiting = r.gauge("specctl_requests_waiting", "Requests queued in the engine's scheduler.")
        self.ttft = r.histogram("specctl_time_to_first_token_seconds", "Time to first token.")
        self.itl = r.histogram("specctl_inter_token_latency_seconds",
                               "Gap between generated tokens (a chunk's gap spread over its tokens).")
        self.e2e = r.histogram("specctl_e2e_request_latency_seconds", "End-to-end request latency.")
        self.spec_accepted = r.counter("specctl_spec_accepted_tokens_total", "Accepted draft tokens.")
        self.spec_verify_steps = r.counter("specctl_spec_verify_steps_total", "Speculative verify steps.")
        self.spec_accept_length = r.histogram(
            "specctl_spec_accept_length", "Accepted draft tokens per verify step.", buckets=tuple(range(0, 17))
        )
        self.adaptive_steps = r.gauge("specctl_adaptive_steps", "Current speculative steps per bucket.", ["bucket"])
        self.transfer_bytes = r.counter(
            "specctl_transfer_bytes_total", "KV + state bytes moved prefill -> decode.", ["direction"]
        )
        self.transfer_seconds = r.histogram("specctl_transfer_seconds", "Per-request KV + state transfer time.")
        self.transfer_failures = r.counter("specctl_transfer_failures_total", "Failed transfers by reason.", ["reason"])
        self.prefill_seconds = r.histogram("specctl_prefill_seconds", "Prefill compute time per request.")
        self.pages_used = r.gauge("specctl_kv_pages_used", "KV pages in use.")
        # A gauge: no _total suffix (that is for counters). `pages_total` keeps its attribute name for callers.
        self.pages_total = r.gauge("specctl_kv_pages_capacity", "KV pages in the pool.")
        self.kv_usage = r.gauge("specctl_kv_cache_usage_ratio", "Fraction of the KV pool in use (0-1).")
        self.http_errors = r.counter("specctl_http_errors_total", "HTTP error responses by status.", ["code"])
        self.http_connections = r.gauge("specctl_http_connections", "Open HTTP connections.")
        self.http_shed = r.counter("specctl_http_shed_total", "Connections and requests shed by admission (idle "
                                   "connections evicted, connections or requests answered 503).", ["reason"])
        self.pd_sessions = r.gauge("specctl_pd_sessions", "Live PD sessions (paired decodes) of this prefill.")
        self.pd_claims_waiting = r.gauge("specctl_pd_claims_waiting",
                                         "Claims holding a room whose HTTP half has not reached prefill.")
        self.pd_transfers_in_flight = r.gauge("specctl_pd_transfers_in_flight",
                                              "Transfers queued or awaiting decode's acknowledgement.")
        self.pd_rejected = r.counter("specctl_pd_rejected_total",
                                     "PD-plane messages refused (malformed, unauthenticated, stale, over a bound).",
                                     ["reason"])

    def set_model_name(self, name: str) -> None:
        self.registry.const_labels = (("model_name", str(name)),)

    def render(self, *, skip: tuple[str, ...] = ()) -> str:
        total = self.pages_total.value()
        if total > 0:
            self.kv_usage.set(self.pages_used.value() / total)
        return self.registry.render(skip=skip)

    # what a role records --------------------------------------------------------------------------
    def record_request(self, *, status: str, e2e_s: float, ttft_s: float | None, prompt_tokens: int | None,
                       accept_lengths: Sequence[int] = ()) -> None:
        """One finished request at a front (colocated, router) or at decode; `prompt_tokens` None when
        this role did not read the prompt (its prompt tokens are counted where they were computed)."""
        self.requests.inc(status=status)
        self.e2e.observe(e2e_s)
        if ttft_s is not None:
            self.ttft.observe(ttft_s)
        if prompt_tokens is not None:
            self.prompt_tokens.inc(prompt_tokens)
        for n in accept_lengths:
            self.spec_accept_length.observe(n)
        self.spec_accepted.inc(sum(accept_lengths))
        self.spec_verify_steps.inc(len(accept_lengths))

    def record_prefill(self, *, prompt_tokens: int, compute_s: float) -> None:
        """One prompt computed by a prefill role."""
        self.requests.inc(status="prefilled")
        self.prompt_tokens.inc(prompt_tokens)
        self.prefill_seconds.observe(compute_s)


class TokenClock:
    """First-token time and inter-token latency of one response, fed each chunk of new tokens.

    A chunk may carry several tokens (speculative decoding accepts a few at once): its gap is spread
    over them, so ITL stays per token (SGLang's and vLLM's definition).
    """

    def __init__(self, metrics: ServingMetrics) -> None:
        self.metrics = metrics
        self.start = time.perf_counter()
        self.first: float | None = None
        self.last: float | None = None

    def tokens(self, n: int) -> None:
        if n <= 0:
            return
        now = time.perf_counter()
        if self.first is None:
            self.first = now
        elif self.last is not None:
            self.metrics.itl.observe((now - self.last) / n)
        self.last = now
        self.metrics.generation_tokens.inc(n)
