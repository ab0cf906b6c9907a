"""Latency sglang-router adds in front of a specctl server: the same requests sent directly to a colocated
server and through sglang-router (regular mode, `--worker-urls`), alternating one by one so machine noise hits
both alike, in one run.

    python benchmarks/router_overhead_bench.py [-c tiny-colocated] [--requests 40] [--max-tokens 8]
        [--port 30000] [--router-port 30010]

Latency = client send -> last byte of a non-streaming completion (and, streamed, -> first token). Reports
p50/p90 of each path and the p50 of the paired differences (router - direct), the added latency. Prints a
table, then one JSON line.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Any

import yaml

from specctl.orchestrate.launcher import Launcher
from specctl.orchestrate.router import OFFLINE_ENV, router_env
from specctl.schemas.deployment import load_deployment


def request(url: str, body: dict[str, Any]) -> tuple[float, float]:
    """(seconds to the first streamed token, seconds to the end) of one request."""
    req = urllib.request.Request(url + "/v1/completions", data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"})
    t0 = time.perf_counter()
    first = None
    with urllib.request.urlopen(req, timeout=120) as r:
        for raw in r:
            if first is None and raw.startswith(b"data: {"):
                first = time.perf_counter() - t0
    end = time.perf_counter() - t0
    return (first if first is not None else end), end


def pct(xs: list[float], q: float) -> float:
    s = sorted(xs)
    return s[min(len(s) - 1, int(q * (len(s) - 1)))]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("-c", "--config", default="tiny-colocated")
    ap.add_argument("--requests", type=int, default=40)
    ap.add_argument("--max-tokens", type=int, default=8)
    ap.add_argument("--port", type=int, default=30000, help="the colocated server's port")
    ap.add_argument("--router-port", type=int, default=30010)
    args = ap.parse_args()

    dep = load_deployment(args.config)
    raw = dict(dep.raw)
    raw["roles"] = {"colocated": {"host": "127.0.0.1", "port": args.port}}
    tmp = Path(tempfile.mkdtemp(prefix="specctl-router-overhead-"))
    path = tmp / "colocated.yaml"
    path.write_text(yaml.safe_dump(raw))
    la = Launcher(load_deployment(path), log_dir=tmp, env=dict(OFFLINE_ENV))
    router: subprocess.Popen[bytes] | None = None
    direct_url, router_url = la.url, f"http://127.0.0.1:{args.router_port}"
    results: dict[str, dict[str, list[float]]] = {k: {"ttft": [], "e2e": []} for k in ("direct", "router")}
    try:
        la.start()
        la.wait_ready(600)
        log = open(tmp / "router.log", "wb")  # noqa: SIM115 - closed with the process
        router = subprocess.Popen(
            [sys.executable, "-m", "sglang_router.launch_router", "--worker-urls", direct_url, "--host", "127.0.0.1",
             "--port", str(args.router_port), "--prometheus-host", "127.0.0.1", "--prometheus-port",
             str(args.router_port + 1), "--shutdown-grace-period-secs", "1", "--log-level", "warn"],
            stdout=log, stderr=subprocess.STDOUT, env=router_env())
        deadline = time.monotonic() + 60
        while True:
            try:
                with urllib.request.urlopen(router_url + "/readiness", timeout=2) as r:
                    if r.status == 200:
                        break
            except OSError:
                pass
            if time.monotonic() > deadline or router.poll() is not None:
                raise SystemExit(f"sglang-router did not become ready; log: {tmp / 'router.log'}")
            time.sleep(0.2)
        body = {"model": dep.role("colocated").model.target, "prompt": "def parse(path):\n",
                "max_tokens": args.max_tokens, "temperature": 0, "ignore_eos": True, "stream": True}
        for url in (direct_url, router_url):  # warm-up: connections, first forwards
            for _ in range(3):
                request(url, body)
        for _ in range(args.requests):
            for name, url in (("direct", direct_url), ("router", router_url)):
                ttft, e2e = request(url, body)
                results[name]["ttft"].append(ttft)
                results[name]["e2e"].append(e2e)
    finally:
        if router is not None:
            router.terminate()
            router.wait(30)
        la.stop()

    added = {m: [r - d for r, d in zip(results["router"][m], results["direct"][m], strict=True)]
             for m in ("ttft", "e2e")}
    print(f"{'':<24}{'p50 (ms)':>10}{'p90 (ms)':>10}")
    for name in ("direct", "router"):
        for m in ("ttft", "e2e"):
            xs = results[name][m]
            print(f"{name + ' ' + m:<24}{1000 * pct(xs, 0.5):>10.2f}{1000 * pct(xs, 0.9):>10.2f}")
    for m in ("ttft", "e2e"):
        print(f"{'added ' + m:<24}{1000 * statistics.median(added[m]):>10.2f}{1000 * pct(added[m], 0.9):>10.2f}")
    print(json.dumps({"benchmark": "router_overhead", "deployment": dep.name, "requests": args.requests,
                      "max_tokens": args.max_tokens,
                      "p50_direct_e2e_s": pct(results["direct"]["e2e"], 0.5),
                      "p50_router_e2e_s": pct(results["router"]["e2e"], 0.5),
                      "p50_added_ttft_s": statistics.median(added["ttft"]),
                      "p50_added_e2e_s": statistics.median(added["e2e"])}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
