"""A burst of requests while a stranger holds idle sockets: admission must shed, never fail.

    python benchmarks/admission_burst.py [-c tiny-colocated] [--requests 2000] [--idle 1030] [--max-tokens 4]
        [--port 30000] [--router] [--router-port 30010]
    python benchmarks/admission_burst.py -c tiny-pd [--requests 2000] [--idle 1030] [--max-tokens 4]
        [--set roles.router.kind=sglang-router]

A colocated deployment (`-c tiny-colocated`): starts its server (and with `--router`, sglang-router in front of it,
regular mode). A disaggregated one (`-c tiny-pd`): starts it as `specctl up` does (prefill, decode and the
deployment's router, smg by default, with `up`'s own argv) on free loopback ports. Then a "stranger" opens
`--idle` connections to every engine (half of them with half-sent headers) and keeps them open, and `--requests`
completions go to the front at once, each on its own connection, honouring `Retry-After` on a 503. Reports the
statuses seen, failures (anything but 200 in the end), the longest run of consecutive failures in completion
order (a circuit-breaker outage shows as one), the p50/p99 latency, how each engine's /health answered during the
burst (probed as the router of `up` probes it: a run of late answers as long as the router's failure threshold
takes the worker out of routing), and each engine's open connections and shed counts from /metrics. Prints a
table, then one JSON line.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import json
import re
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Any

import aiohttp
import yaml

from specctl.orchestrate.launcher import Launcher
from specctl.orchestrate.ports import free_ports
from specctl.orchestrate.router import OFFLINE_ENV, router_env
from specctl.schemas.deployment import load_deployment

HEALTH_EVERY_S = 1.0  # `up` runs the router with --health-check-interval-secs 1
HEALTH_TIMEOUT_S = 5.0  # smg's and sglang-router's default --health-check-timeout-secs


async def one(session: aiohttp.ClientSession, url: str, body: dict[str, Any], seen: collections.Counter[int],
              why: collections.Counter[str]) -> tuple[int, float, float]:
    """(final status, when this request ended, its latency); 0 for a broken one. `why` counts the failures'
    reasons (the error message of a non-200, the exception of a broken request)."""
    t0 = time.perf_counter()
    while True:
        try:
            async with session.post(url + "/v1/completions", json=body) as r:
                raw = await r.read()
                seen[r.status] += 1
                if r.status in (429, 503) and "Retry-After" in r.headers:
                    await asyncio.sleep(float(r.headers["Retry-After"]))
                    continue
                if r.status != 200:
                    why[f"{r.status} {reason(raw)}"] += 1
                return r.status, time.perf_counter(), time.perf_counter() - t0
        except (aiohttp.ClientError, OSError) as exc:
            seen[0] += 1
            why[f"broken: {exc!r}"[:200]] += 1
            return 0, time.perf_counter(), time.perf_counter() - t0


def reason(raw: bytes) -> str:
    """The error message of an error body (OpenAI's object, or text), room numbers and ids elided."""
    try:
        text = str(json.loads(raw)["error"]["message"])
    except (ValueError, KeyError, TypeError):
        text = raw.decode(errors="replace")
    return re.sub(r"\d{4,}", "N", text)[:200]


async def probe(url: str, seconds: list[float]) -> None:
    """GET `url`/health every HEALTH_EVERY_S, as the router's health checker does, recording each answer's seconds
    (HEALTH_TIMEOUT_S for one that did not answer 200 in time) until cancelled."""
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=HEALTH_TIMEOUT_S)) as session:
        while True:
            t0 = time.perf_counter()
            try:
                async with session.get(url + "/health") as r:
                    await r.read()
                    seconds.append(time.perf_counter() - t0 if r.status == 200 else HEALTH_TIMEOUT_S)
            except (aiohttp.ClientError, OSError, asyncio.TimeoutError):
                seconds.append(HEALTH_TIMEOUT_S)
            await asyncio.sleep(max(0.0, HEALTH_EVERY_S - (time.perf_counter() - t0)))


async def fire(url: str, n: int, body: dict[str, Any], engines: list[str]
               ) -> tuple[list[tuple[int, float, float]], collections.Counter[int], collections.Counter[str],
                          dict[str, list[float]]]:
    seen: collections.Counter[int] = collections.Counter()
    why: collections.Counter[str] = collections.Counter()
    health: dict[str, list[float]] = {engine: [] for engine in engines}
    probes = [asyncio.create_task(probe(engine, health[engine])) for engine in engines]
    conn = aiohttp.TCPConnector(limit=0, force_close=True)  # one connection per request, as a burst opens them
    timeout = aiohttp.ClientTimeout(total=1800)
    try:
        async with aiohttp.ClientSession(connector=conn, timeout=timeout) as session:
            results = await asyncio.gather(*(one(session, url, body, seen, why) for _ in range(n)))
    finally:
        for task in probes:
            task.cancel()
        await asyncio.gather(*probes, return_exceptions=True)
    return list(results), seen, why, health


def late_probes(seconds: list[float]) -> tuple[int, int]:
    """(probes at or past HEALTH_TIMEOUT_S, the longest run of them back to back): a router marks a worker
    unhealthy after its failure threshold of consecutive failed probes."""
    run = best = late = 0
    for s in seconds:
        late += s >= HEALTH_TIMEOUT_S
        run = run + 1 if s >= HEALTH_TIMEOUT_S else 0
        best = max(best, run)
    return late, best


def longest_failure_run(results: list[tuple[int, float, float]]) -> int:
    """The most consecutive failures in the order the requests ended: an outage (a router that opened its circuit
    breakers and answers nothing for a while) fails a run of requests back to back."""
    run = best = 0
    for code, _, _ in sorted(results, key=lambda r: r[1]):
        run = run + 1 if code != 200 else 0
        best = max(best, run)
    return best


def pct(xs: list[float], q: float) -> float:
    s = sorted(xs)
    return s[min(len(s) - 1, int(q * (len(s) - 1)))] if s else float("nan")


def wait_ready(url: str, path: str, proc: subprocess.Popen[bytes] | None, timeout_s: float = 60) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline and (proc is None or proc.poll() is None):
        try:
            with urllib.request.urlopen(url + path, timeout=2) as r:
                if r.status == 200:
                    return
        except OSError:
            pass
        time.sleep(0.2)
    raise SystemExit(f"{url} did not become ready")


def deployment_file(config: str, port: int, tmp: Path, sets: list[str]) -> tuple[Path, bool]:
    """The deployment (with `sets` applied) on free loopback ports (colocated: `port`) in `tmp`; whether it is
    disaggregated."""
    dep = load_deployment(config, overrides=sets)
    raw = dict(dep.raw)
    pd = "prefill" in dep.roles and "decode" in dep.roles
    if pd:
        prefill, bootstrap, decode, router, metrics = free_ports(5)
        raw["roles"] = {"prefill": {"host": "127.0.0.1", "port": prefill, "bootstrap_port": bootstrap},
                        "decode": {"host": "127.0.0.1", "port": decode},
                        "router": {**(dep.raw.get("roles", {}).get("router") or {}), "host": "127.0.0.1",
                                   "port": router, "metrics_port": metrics}}
    else:
        raw["roles"] = {"colocated": {"host": "127.0.0.1", "port": port}}
    path = tmp / f"{dep.name}.yaml"
    path.write_text(yaml.safe_dump(raw))
    return path, pd


def scrape(url: str) -> list[str]:
    try:
        with urllib.request.urlopen(url + "/metrics", timeout=10) as r:
            return [line for line in r.read().decode().splitlines() if line.startswith("specctl_http_")]
    except OSError as exc:  # the server itself turned the scrape away
        return [f"/metrics: {exc}"]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("-c", "--config", default="tiny-colocated",
                    help="a colocated or a disaggregated (prefill + decode + router) deployment")
    ap.add_argument("--requests", type=int, default=2000)
    ap.add_argument("--idle", type=int, default=1030, help="idle sockets the stranger holds on each engine")
    ap.add_argument("--max-tokens", type=int, default=4)
    ap.add_argument("--port", type=int, default=30000, help="the colocated server's port")
    ap.add_argument("--router", action="store_true", help="colocated: send the burst through sglang-router")
    ap.add_argument("--router-port", type=int, default=30010)
    ap.add_argument("--set", dest="sets", action="append", default=[], metavar="KEY=VALUE",
                    help="override a deployment value, as specctl's --set (e.g. roles.router.kind=sglang-router)")
    args = ap.parse_args()

    tmp = Path(tempfile.mkdtemp(prefix="specctl-admission-"))
    path, pd = deployment_file(args.config, args.port, tmp, args.sets)
    dep = load_deployment(path)
    la = Launcher(dep, log_dir=tmp, env=dict(OFFLINE_ENV))
    engines = [la.status[n].url for n in la.names if n != "router"]
    router: subprocess.Popen[bytes] | None = None
    stranger: list[socket.socket] = []
    via = f"{dep.raw['roles']['router'].get('kind') or 'smg'} (PD)" if pd else ("sglang-router" if args.router
                                                                                 else "direct")
    try:
        la.start()
        la.wait_ready(600)
        url = la.url
        if args.router and not pd:
            log = open(tmp / "router.log", "wb")  # noqa: SIM115 - closed with the process
            router = subprocess.Popen(
                [sys.executable, "-m", "sglang_router.launch_router", "--worker-urls", la.url, "--host", "127.0.0.1",
                 "--port", str(args.router_port), "--prometheus-host", "127.0.0.1", "--prometheus-port",
                 str(args.router_port + 1), "--shutdown-grace-period-secs", "1", "--log-level", "warn"],
                stdout=log, stderr=subprocess.STDOUT, env=router_env())
            url = f"http://127.0.0.1:{args.router_port}"
            wait_ready(url, "/readiness", router)
        for engine in engines:
            host, port = engine.removeprefix("http://").split(":")
            for i in range(args.idle):
                sock = socket.create_connection((host, int(port)), timeout=10)
                if i % 2:
                    sock.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Ty")
                stranger.append(sock)
        model = str(dep.role("decode" if pd else "colocated").model.target)
        body = {"model": model, "prompt": "def parse(path):\n", "max_tokens": args.max_tokens, "temperature": 0,
                "ignore_eos": True}
        t0 = time.perf_counter()
        results, seen, why, health = asyncio.run(fire(url, args.requests, body, engines))
        wall = time.perf_counter() - t0
        metrics = {engine: scrape(engine) for engine in engines}
    finally:
        for sock in stranger:
            sock.close()
        if router is not None:
            router.terminate()
            router.wait(30)
        la.stop()
    ok = [lat for code, _, lat in results if code == 200]
    failures = len(results) - len(ok)
    run = longest_failure_run(results)
    print(f"requests {args.requests}  idle stranger sockets {args.idle} per engine ({len(engines)})  via {via}")
    print(f"statuses seen {dict(seen)}  failures {failures}  longest failure run {run}  wall {wall:.1f}s")
    for text, count in why.most_common(5):
        print(f"  {count} x {text}")
    print(f"latency p50 {pct(ok, 0.5):.2f}s  p99 {pct(ok, 0.99):.2f}s  max {max(ok, default=float('nan')):.2f}s")
    probes = {engine: {"probes": len(xs), "max_s": max(xs, default=float("nan")), "late": late_probes(xs)[0],
                       "longest_late_run": late_probes(xs)[1]} for engine, xs in health.items()}
    for engine, got in probes.items():
        print(f"/health of {engine} during the burst: {got['probes']} probes, slowest {got['max_s']:.2f}s, "
              f"{got['late']} at or past {HEALTH_TIMEOUT_S:g}s, at most {got['longest_late_run']} in a row")
    print(f"logs in {tmp}")
    print(json.dumps({"benchmark": "admission_burst", "deployment": dep.name, "requests": args.requests,
                      "idle_per_engine": args.idle, "engines": len(engines), "via": via, "failures": failures,
                      "longest_failure_run": run, "statuses": {str(k): v for k, v in seen.items()},
                      "reasons": dict(why), "wall_s": wall,
                      "p50_s": pct(ok, 0.5), "p99_s": pct(ok, 0.99), "health": probes, "metrics": metrics}))
    return 0 if failures == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
