"""Measuring step costs on a running server (`specctl adaptive profile --url`), or on a deployment launched
at each fixed step in turn (`adaptive profile -c DEPLOY --relaunch`).

Contract:

- `server_steps(url)`: what the server runs, from its `/server_info` (SGLang's `/get_server_info` too; behind
  a PD router, the first decode worker's, which smg lists at `/workers`): the speculative algorithm, the
  launch-time steps K (`speculative_num_steps`; 0 without speculation) and whether adaptive steps are on.
  A server that answers none of it is read from SGLang's `sglang:spec_num_steps` gauge (`/metrics`, with
  `--enable-metrics`), else from its responses: SGLang's `spec_num_proposed_drafts / spec_verify_ct` gives K,
  a response without speculative statistics means plain decoding. A gauge that shows other steps after the
  measurement than it ran at is an adaptive server found late: refused as well.
- `profile_urls(urls, batch_sizes, ...)`: for each of `rounds` rounds, each server (the first one rotating)
  and each batch size B, one wave of B streamed completions sent together (different prompts, greedy,
  `ignore_eos`, `max_tokens` each, SGLang's `return_spec_tokens_details`; with `prompt_tokens`, windows as
  long as the server's usage says makes that many tokens), after one untimed wave at the largest B per
  server; a slow phase of a shared machine thus hits every server and batch size alike. Each request's decode
  span over its engine steps is one `RequestTiming`, kept only for the requests whose first token came with
  the wave's last (`_settled`: a span that began before a sibling's prefill would pay for it);
  `adaptive.served_cost` fits them. The span is the server's own first-to-last-token time where it sends one
  (specctl's `timings.decode_s`), else the client's. A server that changes steps under load (adaptive on) is
  refused: a request's verify count does not say at which steps each verify ran. Every request has a timeout
  and every response a size bound.
- `profile_relaunch(deploy, steps, ...)`: per K, launches the deployment (`bench.target.launched`, the
  launcher `specctl up` drives, on free ports) with `speculative.num_steps=K` and adaptive off
  (`speculative.algorithm=none` for K = 0), profiles its URL as above and stops it; the per-K models are
  merged. For `engine: builtin` that runs here; `engine: sglang` needs the GPU SGLang runs on.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import aiohttp

from specctl.adaptive.served_cost import (
    RequestTiming,
    fit_points,
    merge_cost_models,
    prompt_windows,
    served_cost_model,
    served_meta,
)
from specctl.adaptive.sglang_trace import SpecStats, from_sglext
from specctl.adaptive.tune import CostModel
from specctl.bench.probe import ServerProbe
from specctl.bench.prometheus import parse_metrics
from specctl.errors import RuntimeFailure, UsageError

if TYPE_CHECKING:
    from specctl.schemas.deployment import Deployment

MAX_RESPONSE_BYTES = 8 << 20  # one streamed completion, all its events
MAX_EVENT_BYTES = 1 << 20
STEPS_GAUGE = "sglang:spec_num_steps"  # SGLang's --enable-metrics: the steps (adaptive: the tier) in force
FIRST_TOKEN_SLACK_S = 0.002  # first tokens of one prefill step, as the client receives them
Progress = Callable[[str], None]


@dataclass(frozen=True)
class ServerSteps:
    """What a server runs: its speculative algorithm (None: plain), launch-time steps, adaptive or not, and
    where that came from (`server_info`, or None until the responses say)."""

    algorithm: str | None
    steps: int | None
    adaptive: bool
    model: str | None
    source: str | None
    decode: str | None = None  # the decode behind a PD router, whose /metrics tell its steps


@dataclass(frozen=True)
class Sample:
    """One streamed request as the client saw it."""

    first: float | None
    last: float | None
    completion_tokens: int | None
    prompt_tokens: int | None
    spec: SpecStats | None
    error: str | None = None
    server_decode_s: float | None = None  # the server's own first-to-last-token time, where it sends one


async def server_steps(session: aiohttp.ClientSession, url: str) -> ServerSteps:
    """The server's speculative settings (module docstring); fields None where it does not say."""
    probe = ServerProbe(session, url, timeout_s=10)
    model = await probe.first_model()
    # Behind a PD router, the decode's: smg answers /get_server_info from a prefill.
    decode = next((u for name, u in await probe.router_workers() if name == "decode"), None)
    info = await ServerProbe(session, decode, timeout_s=10).server_info() if decode is not None else None
    if not _speaks_spec(info):
        info = await probe.server_info()
    if not _speaks_spec(info):
        gauge = await _metric_steps(session, decode or url)
        return ServerSteps("unknown" if gauge else None, gauge, False, model, None if gauge is None else "metrics",
                           decode)
    assert isinstance(info, dict)
    algo = info.get("speculative_algorithm")
    algorithm = str(algo).lower() if isinstance(algo, str) and algo and algo.lower() != "none" else None
    raw_steps = info.get("speculative_num_steps")
    steps = 0 if algorithm is None else (raw_steps if isinstance(raw_steps, int) and raw_steps > 0 else None)
    adaptive = bool(info.get("speculative_adaptive") or info.get("speculative_adaptive_config"))
    served = info.get("served_model_name")
    return ServerSteps(algorithm, steps, adaptive, model or (served if isinstance(served, str) else None),
                       "server_info", decode)


async def _metric_steps(session: aiohttp.ClientSession, url: str) -> int | None:
    """The steps SGLang's `sglang:spec_num_steps` gauge shows (one value over every series), else None."""
    text = await ServerProbe(session, url, timeout_s=10).get_text("/metrics")
    if not text or len(text) > MAX_RESPONSE_BYTES:
        return None
    values = {v for key, v in parse_metrics(text)[0].items() if key.split("{", 1)[0] == STEPS_GAUGE}
    if len(values) != 1:
        return None
    value = values.pop()
    return int(value) if value >= 0 and value == int(value) else None


def _speaks_spec(info: object) -> bool:
    return isinstance(info, dict) and "speculative_algorithm" in info


async def _stream(session: aiohttp.ClientSession, url: str, body: dict[str, Any], timeout_s: float) -> Sample:
    """Send one streamed completion and time its first and last token (module docstring)."""
    first = last = None
    usage: dict[str, Any] = {}
    spec: SpecStats | None = None
    server_decode: float | None = None
    size = 0
    try:
        async with session.post(url.rstrip("/") + "/v1/completions", json=body,
                                timeout=aiohttp.ClientTimeout(total=timeout_s)) as resp:
            if resp.status != 200:
                text = (await resp.content.read(2000)).decode(errors="replace")
                return Sample(None, None, None, None, None, f"HTTP {resp.status}: {text.strip()[:300]}")
            buffer = b""
            async for chunk in resp.content.iter_any():
                now = time.perf_counter()
                size += len(chunk)
                if size > MAX_RESPONSE_BYTES:
                    return Sample(None, None, None, None, None, f"response over {MAX_RESPONSE_BYTES} bytes")
                buffer += chunk
                *events, buffer = buffer.split(b"\n")
                if len(buffer) > MAX_EVENT_BYTES:
                    return Sample(None, None, None, None, None, f"an event over {MAX_EVENT_BYTES} bytes")
                for line in events:
                    line = line.strip()
                    if not line.startswith(b"data:") or line == b"data: [DONE]":
                        continue
                    try:
                        obj = json.loads(line[5:])
                    except (ValueError, RecursionError):
                        return Sample(None, None, None, None, None, "a streamed event is not JSON")
                    if not isinstance(obj, dict):
                        continue
                    choices = obj.get("choices")
                    if isinstance(choices, list) and any(isinstance(c, dict) and c.get("text") for c in choices):
                        first = now if first is None else first
                        last = now
                    if isinstance(obj.get("usage"), dict):
                        usage = obj["usage"]
                    timings = obj.get("timings") or (usage.get("timings") if usage else None)
                    if isinstance(timings, dict) and _seconds(timings.get("decode_s")) is not None:
                        server_decode = _seconds(timings.get("decode_s"))
                    got = from_sglext(obj)
                    if got:
                        spec = got[0]
    except (aiohttp.ClientError, OSError) as exc:
        return Sample(None, None, None, None, None, f"connection: {exc}")
    except asyncio.TimeoutError:
        return Sample(None, None, None, None, None, f"no complete answer within {timeout_s:.0f} s")
    return Sample(first, last, _int(usage.get("completion_tokens")), _int(usage.get("prompt_tokens")), spec,
                  server_decode_s=server_decode)


def _seconds(v: object) -> float | None:
    return float(v) if isinstance(v, (int, float)) and not isinstance(v, bool) and v >= 0 else None


def _int(v: object) -> int | None:
    return v if isinstance(v, int) and not isinstance(v, bool) else None


def _timing(sample: Sample, batch_size: int, steps: int) -> RequestTiming | None:
    if sample.first is None or sample.last is None:
        return None
    if steps > 0:
        if sample.spec is None:
            return None
        n = sample.spec.verify_ct
    else:
        if sample.completion_tokens is None:
            return None
        n = sample.completion_tokens - 1
    span = sample.server_decode_s if sample.server_decode_s is not None else sample.last - sample.first
    return RequestTiming(batch_size, steps, span, n, sample.prompt_tokens)


@dataclass(frozen=True)
class UrlProfile:
    model: CostModel
    steps: int
    timings: tuple[RequestTiming, ...]


@dataclass
class _Server:
    """One server under measurement: what it runs and what was timed on it so far."""

    url: str
    known: ServerSteps
    steps: int = 0
    timings: list[RequestTiming] = field(default_factory=list)
    server_spans: int = 0


async def _profile(urls: Sequence[str], batch_sizes: Sequence[int], *, rounds: int, max_tokens: int,
                   prompt_tokens: int | None, timeout_s: float, progress: Progress | None,
                   deployment: str | None) -> list[UrlProfile]:
    connector = aiohttp.TCPConnector(limit=0)
    async with aiohttp.ClientSession(connector=connector) as session:
        servers = [_Server(url, await server_steps(session, url)) for url in urls]
        for srv in servers:
            if srv.known.adaptive:
                raise UsageError(f"{srv.url} runs adaptive steps (speculative_adaptive): its verifies run at steps "
                                 "that change with the load, and a request's verify count cannot say at which",
                                 hint="launch it at fixed steps (adaptive off), or measure every K with "
                                      "`specctl adaptive profile -c DEPLOY --relaunch --steps 0,1,3,5,7`")
        prompts = prompt_windows(max(batch_sizes))

        def body(srv: _Server, i: int) -> dict[str, Any]:
            out: dict[str, Any] = {"prompt": prompts[i], "max_tokens": max_tokens, "temperature": 0.0,
                                   "ignore_eos": True, "stream": True, "stream_options": {"include_usage": True},
                                   "return_spec_tokens_details": True}
            if srv.known.model:
                out["model"] = srv.known.model
            return out

        async def wave(srv: _Server, b: int) -> list[Sample]:
            samples = list(await asyncio.gather(*(_stream(session, srv.url, body(srv, i), timeout_s)
                                                  for i in range(b))))
            _check(samples, srv.url)
            return samples

        for srv in servers:
            warm = await wave(srv, max(batch_sizes))  # untimed: first requests pay for lazy set-up
            if prompt_tokens is not None and srv is servers[0]:
                # the server's tokenizer, seen through its usage: characters per token of these prompts
                counts = sorted(c for x in warm if (c := x.prompt_tokens))
                if not counts:
                    raise RuntimeFailure(f"{srv.url} reports no prompt_tokens in its usage: --prompt-tokens "
                                         "cannot be matched", hint="leave --prompt-tokens out")
                chars = round(prompt_tokens * len(prompts[0]) / counts[len(counts) // 2])
                prompts = prompt_windows(max(batch_sizes), max(1, chars))
                warm = await wave(srv, max(batch_sizes))
            srv.steps = srv.known.steps if srv.known.steps is not None else _steps_from(warm)
            if progress is not None:
                what = ("plain decoding (steps 0)" if srv.steps == 0
                        else f"{srv.known.algorithm or 'speculative'} at steps {srv.steps}")
                progress(f"{srv.url}: {what}; {rounds} round(s) of waves at batch sizes {list(batch_sizes)}, "
                         f"{max_tokens} tokens each")
        # Round-major, every server and batch size in each round: a slow phase of a shared machine hits all alike.
        for r in range(rounds):
            for srv in servers[r % len(servers):] + servers[:r % len(servers)]:
                for b in batch_sizes:
                    samples = await wave(srv, b)
                    if srv.steps > 0 and any(s.spec is None for s in samples):
                        raise RuntimeFailure(f"{srv.url} runs steps {srv.steps} but did not report a request's verify "
                                             "count (sglext.spec_tokens_details)",
                                             hint="an SGLang server reports it when the request sets "
                                                  "return_spec_tokens_details; check the server's version")
                    settled = _settled(samples)
                    srv.timings += [t for s in settled if (t := _timing(s, b, srv.steps)) is not None]
                    srv.server_spans += sum(s.server_decode_s is not None for s in settled)
            if progress is not None:
                progress(f"round {r + 1} of {rounds} measured")
        for srv in servers:  # a server that changed steps under the load ran some verifies at other steps
            seen = await _metric_steps(session, srv.known.decode or srv.url)
            if seen is not None and seen != srv.steps:
                raise RuntimeFailure(f"{srv.url}: {STEPS_GAUGE} shows steps {seen} after the measurement at steps "
                                     f"{srv.steps}: the server changes steps (adaptive), so its verify counts do "
                                     "not say at which steps they ran",
                                     hint="launch it at fixed steps (adaptive off), or use -c DEPLOY --relaunch")
        return [_fitted(srv, rounds=rounds, max_tokens=max_tokens, progress=progress, deployment=deployment)
                for srv in servers]


def _fitted(srv: _Server, *, rounds: int, max_tokens: int, progress: Progress | None,
            deployment: str | None) -> UrlProfile:
    seen = sorted(t.prompt_tokens for t in srv.timings if t.prompt_tokens is not None)
    meta = served_meta(url=srv.url, model=srv.known.model, steps=srv.steps, algorithm=srv.known.algorithm,
                       max_tokens=max_tokens, rounds=rounds, prompt_tokens=seen[len(seen) // 2] if seen else None,
                       deployment=deployment)
    meta["steps_from"] = srv.known.source or "responses"
    meta["decode_span"] = ("the server's (timings.decode_s)" if srv.timings and srv.server_spans >= len(srv.timings)
                           else "the client's (first to last streamed token)")
    fits = fit_points(srv.timings)
    if progress is not None:
        for b, row in fits.items():
            for k, p in row.items():
                progress(f"batch {b}, steps {k}: {p.step_s * 1e3:.2f} ms a step (quartiles "
                         f"{p.low * 1e3:.2f}-{p.high * 1e3:.2f}, {p.samples} requests)")
    return UrlProfile(served_cost_model(fits, meta), srv.steps, tuple(srv.timings))


def _settled(samples: Sequence[Sample]) -> list[Sample]:
    """The requests of a wave whose decode span holds no sibling's prefill: those whose first token came with
    the wave's last first token (within FIRST_TOKEN_SLACK_S), so every step they were timed over ran the
    whole wave's decode. A request prefilled before a sibling would be charged that prefill."""
    firsts = [s.first for s in samples if s.first is not None]
    if not firsts:
        return []
    last_first = max(firsts)
    return [s for s in samples if s.first is not None and s.first >= last_first - FIRST_TOKEN_SLACK_S]


def _check(samples: Sequence[Sample], url: str) -> None:
    bad = [s.error for s in samples if s.error is not None]
    if bad:
        raise RuntimeFailure(f"{url}: {len(bad)} of {len(samples)} requests failed: {bad[0]}",
                             hint="check that the server is up and answers /v1/completions with streaming")


def _steps_from(samples: Sequence[Sample]) -> int:
    """K from the responses: SGLang's proposed drafts over verifies; plain decoding without statistics."""
    specs = [s.spec for s in samples if s.spec is not None]
    if not specs:
        return 0
    launch = {s.launch_steps for s in specs if s.launch_steps is not None}
    if len(launch) == 1:
        return launch.pop()
    raise RuntimeFailure("the server speculates but neither /server_info (speculative_num_steps) nor its responses "
                         "(spec_num_proposed_drafts) say at how many steps",
                         hint="profile the server directly, not through a proxy that hides /server_info")


def profile_urls(urls: Sequence[str], batch_sizes: Sequence[int], *, rounds: int = 3, max_tokens: int = 64,
                 prompt_tokens: int | None = None, timeout_s: float = 300.0, progress: Progress | None = None,
                 deployment: str | None = None) -> list[UrlProfile]:
    """Measure the steps each server runs, the servers' waves interleaved round by round (module docstring)."""
    for url in urls:
        if not url.startswith(("http://", "https://")):
            raise UsageError(f"--url {url!r}: expected http://HOST:PORT")
    if len(set(urls)) != len(urls):
        raise UsageError("the same --url is given twice")
    if max_tokens < 2:
        raise UsageError(f"--max-tokens {max_tokens}: a decode span needs at least 2 tokens")
    return asyncio.run(_profile(urls, batch_sizes, rounds=rounds, max_tokens=max_tokens, prompt_tokens=prompt_tokens,
                                timeout_s=timeout_s, progress=progress, deployment=deployment))


def profile_url(url: str, batch_sizes: Sequence[int], **kwargs: Any) -> UrlProfile:
    """`profile_urls` of one server."""
    return profile_urls([url], batch_sizes, **kwargs)[0]


def step_overrides(k: int) -> list[str]:
    """The overrides that launch a deployment at fixed steps k (adaptive off; 0: no speculation)."""
    if k == 0:
        return ["speculative.algorithm=none", "speculative.adaptive=null"]
    return [f"speculative.num_steps={k}", "speculative.adaptive=null"]


def _free_ports(dep: Deployment) -> list[str]:
    """Overrides moving every port of every role to a free one, the roles' default ports included (a launch
    never takes a port another server on this machine may hold)."""
    from specctl.bench.ab import port_overrides
    from specctl.orchestrate.ports import free_port

    moved = port_overrides(dep.raw)
    roles = dep.raw.get("roles") if isinstance(dep.raw.get("roles"), dict) else {}
    taken = {int(m.rsplit("=", 1)[1]) for m in moved}
    for role in dep.roles:
        body = roles.get(role) if isinstance(roles, dict) else None
        if isinstance(body, list):
            continue  # several instances: each names its own ports
        if not (isinstance(body, dict) and "port" in body):
            port = free_port(taken=taken)
            taken.add(port)
            moved.append(f"roles.{role}.port={port}")
    return moved


def profile_relaunch(deploy: str, steps: Sequence[int], batch_sizes: Sequence[int], *, overrides: Sequence[str] = (),
                     rounds: int = 3, max_tokens: int = 64, prompt_tokens: int | None = None, timeout_s: float = 300.0,
                     progress: Progress | None = None) -> CostModel:
    """Launch the deployment at each fixed step in turn and measure it (module docstring)."""
    from specctl.bench.target import launched
    from specctl.schemas.deployment import load_deployment

    dep = load_deployment(deploy, overrides=overrides)
    decoding = next((dep.role(r) for r in ("decode", "colocated") if r in dep.roles), None)
    if decoding is None or decoding.speculative.algorithm == "none":
        if any(k > 0 for k in steps):
            raise UsageError(f"{deploy}: the deployment does not speculate (speculative.algorithm: none): "
                             "steps above 0 cannot be launched", hint="profile the speculative deployment")
    models: list[CostModel] = []
    for k in steps:
        extra = [*overrides, *step_overrides(k)]
        moved = _free_ports(load_deployment(deploy, overrides=extra))  # never the preset's fixed ports
        if progress is not None:
            progress(f"launching {dep.name} at steps {k} ...")
        with launched(deploy, [*extra, *moved]) as target:
            if progress is not None:
                progress(f"steps {k}: ready at {target.url}")
            prof = profile_url(target.url, batch_sizes, rounds=rounds, max_tokens=max_tokens,
                               prompt_tokens=prompt_tokens, timeout_s=timeout_s, progress=progress,
                               deployment=dep.name)
        if prof.steps != k:
            raise RuntimeFailure(f"{dep.name} launched with steps {k} reports steps {prof.steps}",
                                 hint="check the deployment's per-role speculative settings")
        models.append(prof.model)
    merged = merge_cost_models(models)
    return CostModel(merged.step_s, {**merged.meta, "deployment": dep.name, "relaunched": list(steps),
                                     "device": "its servers, launched at each step (served steps, timed per request)"})
