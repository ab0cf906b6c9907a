"""run_bench: one whole bench against a URL -- probe, warm up, run every sweep point, build records.

For each sweep point: snapshot the server (`/server_info`, `/metrics`; for a launched deployment
the roles behind its router, see `probe.DeploymentProbe`), run the load, snapshot again, and turn
results + snapshots into a record (see `record`). Warm-up requests (the first prompt, output capped
at 16 tokens) run before the first point and are excluded from every metric; if all of them fail
the server is not usable and `RuntimeFailure` says why. Failures of measured requests are counted
in the record, never raised.
"""

from __future__ import annotations

import asyncio
import dataclasses
import math
import time
import uuid
from typing import Any, Protocol

import aiohttp

import specctl
from specctl.adaptive.sglang_trace import append_lines, bench_request_lines
from specctl.bench import record as bench_record
from specctl.bench.acceptance import summarize_acceptance
from specctl.bench.config import BenchConfig, LoadPoint
from specctl.bench.load import LoadResult, run_load
from specctl.bench.metrics import summarize_load
from specctl.bench.probe import DeploymentProbe, ServerProbe, ServerSnapshot
from specctl.bench.record import json_safe, utc_now
from specctl.bench.request import RequestResult, RequestSender
from specctl.bench.workload import Prompt, build_workload
from specctl.errors import RuntimeFailure
from specctl.schemas import server_info as si
from specctl.schemas.prometheus import metrics_delta, sglang_metrics, spec_accept_length


class ProgressSink(Protocol):
    """What the runner reports while it runs (see `progress`)."""

    def start_point(self, index: int, count: int, point: LoadPoint, total: int | None) -> None: ...
    def on_result(self, result: RequestResult) -> None: ...
    def end_point(self) -> None: ...


@dataclasses.dataclass
class PointRun:
    """One sweep point's raw material: the load and the server snapshots around it."""

    load: LoadResult
    before: ServerSnapshot
    after: ServerSnapshot
    record: dict[str, Any]


@dataclasses.dataclass(frozen=True)
class Provenance:
    """What produced the server under test, when known (set by `specctl bench -c`)."""

    deployment: dict[str, Any] | None = None
    fingerprint: str | None = None
    # The live preflight of the pair behind the URL: {"ok": bool, "prefill": fp, "decode": fp}.
    preflight: dict[str, Any] | None = None
    # The launched engine processes behind the URL, (instance name, URL): prefill, prefill.1, decode ...
    # When set, the snapshots read these (a router has no engine /server_info or /metrics of its own).
    roles: tuple[tuple[str, str], ...] = ()


def run_bench(config: BenchConfig, *, progress: ProgressSink | None = None,
              provenance: Provenance = Provenance()) -> list[PointRun]:
    """Run every sweep point of `config` against `config.url` (blocking; owns its event loop)."""
    return asyncio.run(_bench(config, progress, provenance))


async def _bench(config: BenchConfig, progress: ProgressSink | None, provenance: Provenance) -> list[PointRun]:
    prompts = build_workload(config.workload)
    connector = aiohttp.TCPConnector(limit=0, ttl_dns_cache=300)
    async with aiohttp.ClientSession(connector=connector, read_bufsize=2**20) as session:
        probe = ServerProbe(session, config.url)
        model = config.model or await probe.first_model() or "default"
        roles = provenance.roles or await probe.router_workers()  # bench --url of a router: its workers
        snapshots: ServerProbe | DeploymentProbe = (
            DeploymentProbe(session, config.url, roles) if roles else probe)
        sender = RequestSender(session, config, model)
        bodies = [sender.body(p) for p in prompts]
        await _warmup(sender, prompts[0], config.warmup_requests)
        runs: list[PointRun] = []
        for i, point in enumerate(config.points):
            total = None if config.duration_s is not None else len(prompts)
            if progress is not None:
                progress.start_point(i, len(config.points), point, total)
            before = await snapshots.snapshot()
            try:
                load = await run_load(sender, prompts, bodies, point, duration_s=config.duration_s,
                                      burstiness=config.burstiness, seed=config.workload.seed,
                                      on_result=progress.on_result if progress is not None else None)
            finally:
                if progress is not None:
                    progress.end_point()
            after = await snapshots.snapshot()
            record = build_record(config, model, load, before, after, provenance)
            if config.spec_trace_out:
                lines = bench_request_lines(load.results, _launch_info(after), uuid.uuid4().hex[:12],
                                            steps=config.spec_trace_steps)
                append_lines(config.spec_trace_out, lines)
                record["spec_trace"] = {"path": config.spec_trace_out, "requests": len(lines)}
            runs.append(PointRun(load, before, after, record))
        return runs


def _launch_info(snap: ServerSnapshot) -> object:
    """Where the launch-time steps are: the URL's /server_info, else (behind a router) a decode role's."""
    if snap.server_info is not None:
        return snap.server_info
    return [info for name, info in snap.roles.items() if name.startswith("decode") and info is not None]


async def _warmup(sender: RequestSender, prompt: Prompt, n: int) -> None:
    if n <= 0:
        return
    body = sender.body(prompt, max_tokens=min(prompt.output_len, 16))
    results = [RequestResult(index=-1 - i, prompt_len=prompt.prompt_len, output_len=16, scheduled=time.perf_counter())
               for i in range(n)]
    await asyncio.gather(*(sender.send(r, body) for r in results))
    if not any(r.ok for r in results):
        first = results[0]
        raise RuntimeFailure(f"all {n} warm-up request(s) failed: {first.error_kind}: {first.error}",
                             hint="check --url, --endpoint and --model (or the server's log)")


def build_record(config: BenchConfig, model: str, load: LoadResult, before: ServerSnapshot, after: ServerSnapshot,
                 provenance: Provenance) -> dict[str, Any]:
    """The JSON record of one sweep point (see `record.REQUIRED_FIELDS`)."""
    w = config.workload
    point = load.point
    rec: dict[str, Any] = {
        "specctl_version": specctl.__version__, "date": utc_now(), "backend": "openai-compatible",
        "url": config.url, "model": model, "endpoint": config.endpoint, "tag": config.tag,
        "dataset_name": w.dataset_name, "num_prompts": w.num_prompts,
        "request_rate": point.request_rate if math.isfinite(point.request_rate) else "inf",
        "max_concurrency": point.max_concurrency, "burstiness": config.burstiness,
        "duration_limit_s": config.duration_s, "random_input_len": w.random_input_len,
        "random_output_len": w.random_output_len, "random_range_ratio": w.random_range_ratio,
        "sharegpt_output_len": w.sharegpt_output_len, "seed": w.seed, "warmup_requests": config.warmup_requests,
    }
    rec["sampling"] = {"temperature": config.temperature, "ignore_eos": config.ignore_eos,
                       **{k: v for k, v in config.extra_request_body.items() if k in bench_record.SAMPLING_FIELDS}}
    rec.update(summarize_load(load, config.slo))
    server_accept = si.server_accept_length(after.server_info)
    from_metrics = server_accept is None
    if from_metrics:  # an SGLang router or server without acceptance in /server_info: its gauge
        server_accept = spec_accept_length(after.metrics_text)
    rec.update(summarize_acceptance(load.results, server_accept))
    if from_metrics and rec.get("accept_length_source") == "server_info":
        rec["accept_length_source"] = "metrics"
    switches = si.adaptive_switches(before.server_info, after.server_info)
    rec["adaptive"] = {
        "switches": _relative_times(switches, load),
        "time_per_step_ms": si.time_per_step(after.server_info),
        "batches_per_steps": si.batches_per_steps(before.server_info, after.server_info),
        "state": si.adaptive_state(after.server_info),
    } if after.server_info is not None else None
    rec["server_metrics"] = metrics_delta(before.metrics_text, after.metrics_text)
    rec["sglang_metrics"] = sglang_metrics(after.metrics_text)
    rec["preflight"] = provenance.preflight
    rec["fingerprint"] = provenance.fingerprint or si.fingerprint(after.server_info)
    rec["deployment"] = provenance.deployment
    rec["config"] = config.to_json()
    bench_record.add_aliases(rec)  # vLLM's names for the numbers above
    if config.output_details:
        rec["details"] = _details(load)
    safe: dict[str, Any] = json_safe(rec)
    return safe


def _details(load: LoadResult) -> dict[str, list[Any]]:
    """Per-request arrays in launch order (bench_serving's --output-details names where they exist)."""
    rs = load.results
    return {"input_lens": [r.prompt_tokens for r in rs], "output_lens": [r.output_tokens if r.ok else 0 for r in rs],
            "ttfts": [r.ttft if r.ok else None for r in rs], "itls": [r.itl for r in rs],
            "e2e_latencies": [r.e2e if r.ok else None for r in rs],
            "scheduled": [r.scheduled - load.start for r in rs], "send_delays": [r.send_delay for r in rs],
            "errors": [r.error_kind or "" for r in rs]}


def _relative_times(switches: list[dict[str, Any]] | None, load: LoadResult) -> list[dict[str, Any]] | None:
    """Add `t_rel_s` (seconds since the run started) to each switch where its clock is recognisable:
    a Unix timestamp, or this host's monotonic clock (a local server). Otherwise None."""
    if switches is None:
        return None
    out = []
    for s in switches[:1000]:
        t = s.get("time")
        rel = None
        if isinstance(t, (int, float)) and not isinstance(t, bool):
            rel = t - load.wall_start if t > 1e9 else t - load.mono_start
            if not -60.0 <= rel <= load.duration + 60.0:
                rel = None  # another host's monotonic clock (or a step index): not alignable
        out.append({**s, "t_rel_s": rel})
    return out
