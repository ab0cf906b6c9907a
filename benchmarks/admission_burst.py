"""A burst of requests while a stranger holds idle sockets: admission must shed, never fail.

    python benchmarks/admission_burst.py [-c tiny-colocated] [--requests 2000] [--idle 1030] [--max-tokens 4]
        [--port 30000] [--router] [--router-port 30010]

Starts a colocated server (and with `--router`, sglang-router in front of it, regular mode), opens `--idle`
connections to the server from a "stranger" (half of them with half-sent headers) and keeps them open, then sends
`--requests` completions at once, each on its own connection, and honours `Retry-After` on a 503. Reports the
statuses seen, failures (anything but 200 in the end), the p50/p99 latency, and the server's open connections
and shed counts from /metrics. Prints a table, then one JSON line.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import json
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
from specctl.orchestrate.router import OFFLINE_ENV, router_env
from specctl.schemas.deployment import load_deployment


async def one(session: aiohttp.ClientSession, url: str, body: dict[str, Any], seen: collections.Counter[int]
              ) -> tuple[int, float]:
    t0 = time.perf_counter()
    while True:
        try:
            async with session.post(url + "/v1/completions", json=body) as r:
                await r.read()
                seen[r.status] += 1
                if r.status == 503 and "Retry-After" in r.headers:
                    await asyncio.sleep(float(r.headers["Retry-After"]))
                    continue
                return r.status, time.perf_counter() - t0
        except (aiohttp.ClientError, OSError):
            seen[0] += 1
            return 0, time.perf_counter() - t0


async def fire(url: str, n: int, body: dict[str, Any]) -> tuple[list[tuple[int, float]], collections.Counter[int]]:
    seen: collections.Counter[int] = collections.Counter()
    conn = aiohttp.TCPConnector(limit=0, force_close=True)  # one connection per request, as a burst opens them
    timeout = aiohttp.ClientTimeout(total=1800)
    async with aiohttp.ClientSession(connector=conn, timeout=timeout) as session:
        results = await asyncio.gather(*(one(session, url, body, seen) for _ in range(n)))
    return list(results), seen


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


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("-c", "--config", default="tiny-colocated")
    ap.add_argument("--requests", type=int, default=2000)
    ap.add_argument("--idle", type=int, default=1030)
    ap.add_argument("--max-tokens", type=int, default=4)
    ap.add_argument("--port", type=int, default=30000)
    ap.add_argument("--router", action="store_true", help="send the burst through sglang-router")
    ap.add_argument("--router-port", type=int, default=30010)
    args = ap.parse_args()

    dep = load_deployment(args.config)
    raw = dict(dep.raw)
    raw["roles"] = {"colocated": {"host": "127.0.0.1", "port": args.port}}
    tmp = Path(tempfile.mkdtemp(prefix="specctl-admission-"))
    path = tmp / "colocated.yaml"
    path.write_text(yaml.safe_dump(raw))
    la = Launcher(load_deployment(path), log_dir=tmp, env=dict(OFFLINE_ENV))
    router: subprocess.Popen[bytes] | None = None
    stranger: list[socket.socket] = []
    try:
        la.start()
        la.wait_ready(600)
        url = la.url
        if args.router:
            log = open(tmp / "router.log", "wb")  # noqa: SIM115 - closed with the process
            router = subprocess.Popen(
                [sys.executable, "-m", "sglang_router.launch_router", "--worker-urls", la.url, "--host", "127.0.0.1",
                 "--port", str(args.router_port), "--prometheus-host", "127.0.0.1", "--prometheus-port",
                 str(args.router_port + 1), "--shutdown-grace-period-secs", "1", "--log-level", "warn"],
                stdout=log, stderr=subprocess.STDOUT, env=router_env())
            url = f"http://127.0.0.1:{args.router_port}"
            wait_ready(url, "/readiness", router)
        host, port = la.url.removeprefix("http://").split(":")
        for i in range(args.idle):
            sock = socket.create_connection((host, int(port)), timeout=10)
            if i % 2:
                sock.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Ty")
            stranger.append(sock)
        body = {"model": dep.role("colocated").model.target, "prompt": "def parse(path):\n",
                "max_tokens": args.max_tokens, "temperature": 0, "ignore_eos": True}
        t0 = time.perf_counter()
        results, seen = asyncio.run(fire(url, args.requests, body))
        wall = time.perf_counter() - t0
        try:
            with urllib.request.urlopen(la.url + "/metrics", timeout=10) as r:
                metrics = [line for line in r.read().decode().splitlines() if line.startswith("specctl_http_")]
        except OSError as exc:  # the server itself turned the scrape away
            metrics = [f"/metrics: {exc}"]
    finally:
        for sock in stranger:
            sock.close()
        if router is not None:
            router.terminate()
            router.wait(30)
        la.stop()
    ok = [s for code, s in results if code == 200]
    failures = len(results) - len(ok)
    print(f"requests {args.requests}  idle stranger sockets {args.idle}  via {'router' if args.router else 'direct'}")
    print(f"statuses seen {dict(seen)}  failures {failures}  wall {wall:.1f}s")
    print(f"latency p50 {pct(ok, 0.5):.2f}s  p99 {pct(ok, 0.99):.2f}s  max {max(ok, default=float('nan')):.2f}s")
    print(json.dumps({"benchmark": "admission_burst", "deployment": dep.name, "requests": args.requests,
                      "idle": args.idle, "router": args.router, "failures": failures,
                      "statuses": {str(k): v for k, v in seen.items()}, "wall_s": wall,
                      "p50_s": pct(ok, 0.5), "p99_s": pct(ok, 0.99), "metrics": metrics}))
    return 0 if failures == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
