"""Client capacity of `specctl bench` against an instant stub server, side by side with a naive pacer.

Targets: at 500 req/s on 2 cores the achieved request rate is >= 0.99x the target, and the
latency the client itself adds is < 1 ms at p99.

- The stub (one token per request, no delays) runs in a separate process, so it competes with the
  client for the same cores -- on a 2-core machine that is part of what is measured. By default it
  is a minimal asyncio HTTP server (~0.05 ms CPU per request); `--stub aiohttp` uses
  `specctl.bench.stub_server` (~0.5 ms per request) instead.
- specctl: the bench's own load path (`run_load`: absolute schedule, pacer thread).
- naive: the same requests and Poisson schedule, paced the way many clients do it: create the task,
  then `await asyncio.sleep(gap)` (cumulative sleeps; each lateness adds up).
- raw floor: the same schedule from a blocking raw socket in a thread (one keep-alive connection,
  pre-built bytes, no HTTP library, no event loop). Its added latency is what loopback delivery and
  the OS scheduler cost on this machine right now -- a floor no Python client goes below -- so the
  specctl row can be read against it when the cores are shared.
- client-added latency per request = client TTFT (from the scheduled time) - the stub's own TTFT
  (its first-chunk write minus its receive time, from `/stub/log`). It includes the client's send
  lateness, HTTP encoding and parsing and loopback delivery: everything that is not the server.
- client CPU per request (process time of the client over the run / requests): the load-independent
  cost; `client_cpu_share_at_target` is the fraction of one core the client needs at the target
  rate. On a shared machine whose cores are busy with other work, the rate and latency targets
  depend on the CPU left over; the load average is printed with the results.

Usage: python benchmarks/bench_client_capacity.py [--rate 500] [--num 3000]
Prints a table, then a last-line JSON summary.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import re
import socket
import subprocess
import sys
import time

import aiohttp
import numpy as np

from specctl.bench.arrivals import arrival_offsets
from specctl.bench.config import BenchConfig, LoadPoint, WorkloadConfig
from specctl.bench.load import run_load
from specctl.bench.request import RequestResult, RequestSender
from specctl.bench.workload import build_workload


async def _naive(sender: RequestSender, prompts, bodies, rate: float, seed: int) -> list[RequestResult]:
    offsets = arrival_offsets(len(prompts), rate, seed=seed)
    results: list[RequestResult] = []
    tasks = []
    for i, p in enumerate(prompts):
        # The naive client's notion of "scheduled" is when it gets round to sending.
        r = RequestResult(index=i, prompt_len=p.prompt_len, output_len=p.output_len, scheduled=time.perf_counter())
        results.append(r)
        tasks.append(asyncio.ensure_future(sender.send(r, bodies[i])))
        if i + 1 < len(offsets):
            await asyncio.sleep(offsets[i + 1] - offsets[i])
    await asyncio.gather(*tasks)
    return results


def _floor(url: str, bodies: list[bytes], offsets, n: int) -> list[RequestResult]:
    """The floor of this machine: a blocking raw socket, one keep-alive connection, pre-built bytes,
    a thread sleeping to each absolute deadline. No HTTP library, no event loop: what is left of its
    added latency is loopback delivery and the OS scheduler (the cores shared with the stub and with
    whatever else runs), which no client can remove."""
    host, port = url.removeprefix("http://").split(":")
    reqs = [(f"POST /v1/completions HTTP/1.1\r\nHost: {host}:{port}\r\nContent-Type: application/json\r\n"
             f"Content-Length: {len(b)}\r\n\r\n").encode() + b for b in bodies]
    rid = re.compile(rb'"id": "([^"]+)"')
    out: list[RequestResult] = []
    with socket.create_connection((host, int(port))) as sock:
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        start = time.perf_counter() + 0.02
        for i in range(n):
            r = RequestResult(index=i, prompt_len=1, output_len=1, scheduled=start + offsets[i])
            delay = r.scheduled - time.perf_counter()
            if delay > 0:
                time.sleep(delay)
            r.sent = time.perf_counter()
            sock.sendall(reqs[i % len(reqs)])
            buf = sock.recv(65536)
            r.first_token = time.perf_counter()
            while not buf.endswith(b"0\r\n\r\n"):
                buf += sock.recv(65536)
            r.end = time.perf_counter()
            m = rid.search(buf)
            r.response_id = m.group(1).decode() if m else None
            out.append(r)
    return out


async def _measure(url: str, rate: float, n: int, seed: int) -> dict[str, object]:
    cfg = BenchConfig(url=url, workload=WorkloadConfig(num_prompts=n, random_input_len=32, random_output_len=1,
                                                       seed=seed), points=(LoadPoint(rate),), warmup_requests=0)
    connector = aiohttp.TCPConnector(limit=0)
    async with aiohttp.ClientSession(connector=connector) as session:
        sender = RequestSender(session, cfg, "stub-model")
        prompts = build_workload(cfg.workload)
        bodies = [sender.body(p) for p in prompts]
        # Warm the connection pool so both variants start from the same state.
        warm = [RequestResult(index=-1, prompt_len=1, output_len=1, scheduled=time.perf_counter()) for _ in range(32)]
        await asyncio.gather(*(sender.send(r, bodies[0]) for r in warm))
        cpu0 = time.process_time()
        load = await run_load(sender, prompts, bodies, LoadPoint(rate), seed=seed)
        cpu1 = time.process_time()
        naive = await _naive(sender, prompts, bodies, rate, seed)
        cpu2 = time.process_time()
        floor = await asyncio.to_thread(_floor, url, bodies, arrival_offsets(n, rate, seed=seed), n)
        cpu3 = time.process_time()
        async with session.get(url + "/stub/log") as resp:
            log = {rec["id"]: rec for rec in await resp.json()}
    out: dict[str, object] = {}
    for name, results, cpu in (("specctl", load.results, cpu1 - cpu0), ("naive", naive, cpu2 - cpu1),
                               ("floor", floor, cpu3 - cpu2)):
        sent = [r.sent for r in results]
        ok = [r for r in results if r.ok]
        added, wire_in, wire_out = [], [], []
        for r in ok:
            srv = log.get(r.response_id or "")
            if srv and srv.get("first_write") is not None:
                added.append((r.ttft - (srv["first_write"] - srv["recv"])) * 1000.0)
                # Same CLOCK_MONOTONIC in both processes (Linux): split the added time into its legs.
                wire_in.append((srv["recv"] - r.sent) * 1000.0)
                wire_out.append((r.first_token - srv["first_write"]) * 1000.0)
        a = np.asarray(added) if added else np.asarray([np.nan])
        out[name] = {
            "achieved_rate": (len(sent) - 1) / (max(sent) - min(sent)),
            "errors": len(results) - len(ok),
            "client_added_p50_ms": float(np.percentile(a, 50)),
            "client_added_p99_ms": float(np.percentile(a, 99)),
            "send_delay_p50_ms": float(np.percentile([(r.sent - r.scheduled) * 1000 for r in results], 50)),
            "send_delay_p99_ms": float(np.percentile([(r.sent - r.scheduled) * 1000 for r in results], 99)),
            "to_stub_p99_ms": float(np.percentile(wire_in or [np.nan], 99)),
            "from_stub_p99_ms": float(np.percentile(wire_out or [np.nan], 99)),
            # The client process's own CPU per request (all threads): what the rate costs, whatever the load.
            "cpu_ms_per_request": 1000.0 * cpu / len(results),
        }
    return out


class _LeanStub(asyncio.Protocol):
    """An instant OpenAI-style SSE server in ~50 lines of asyncio (HTTP/1.1 keep-alive, chunked).

    The aiohttp stub costs ~0.5 ms of CPU per request; on a 2-core machine that competes with the
    client being measured, so the capacity run uses this one (`--stub aiohttp` for the other).
    `GET /stub/log` returns the same per-request timestamps as the aiohttp stub's.
    """

    log: dict[str, dict[str, float]] = {}
    count = 0

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport
        self.buf = b""

    def data_received(self, data: bytes) -> None:
        recv = time.perf_counter()
        self.buf += data
        while True:
            head_end = self.buf.find(b"\r\n\r\n")
            if head_end < 0:
                return
            head = self.buf[:head_end].decode("latin-1")
            length = 0
            for line in head.split("\r\n")[1:]:
                name, _, value = line.partition(":")
                if name.strip().lower() == "content-length":
                    length = int(value)
            if len(self.buf) < head_end + 4 + length:
                return
            self.buf = self.buf[head_end + 4 + length:]
            if head.startswith("GET /stub/log"):
                body = json.dumps([{"id": k, **v} for k, v in self.log.items()]).encode()
                self.transport.write(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: "
                                     + str(len(body)).encode() + b"\r\n\r\n" + body)
                continue
            rid = f"lean-{_LeanStub.count}"
            _LeanStub.count += 1
            chunk = (b'data: {"id": "' + rid.encode() + b'", "choices": [{"index": 0, "text": "x", '
                     b'"finish_reason": "length"}], "usage": {"prompt_tokens": 32, "completion_tokens": 1}}\n\n'
                     b"data: [DONE]\n\n")
            stamp = time.perf_counter()
            self.transport.write(b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n"
                                 b"Transfer-Encoding: chunked\r\n\r\n"
                                 + f"{len(chunk):x}".encode() + b"\r\n" + chunk + b"\r\n0\r\n\r\n")
            self.log[rid] = {"recv": recv, "first_write": stamp}


def _serve_lean() -> None:
    async def serve() -> None:
        loop = asyncio.get_running_loop()
        server = await loop.create_server(_LeanStub, "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]
        print(f"http://127.0.0.1:{port}", flush=True)
        await loop.run_in_executor(None, sys.stdin.read)  # until the parent closes our stdin
        server.close()

    asyncio.run(serve())


def _proc_cpu_s(pid: int) -> float:
    """user + system CPU seconds of a process (Linux /proc; NaN elsewhere)."""
    try:
        with open(f"/proc/{pid}/stat") as fh:
            fields = fh.read().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    except (OSError, IndexError, ValueError):
        return float("nan")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rate", type=float, default=500.0)
    ap.add_argument("--num", type=int, default=3000)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--stub", choices=("lean", "aiohttp"), default="lean",
                    help="lean: a minimal asyncio server (default); aiohttp: specctl.bench.stub_server")
    ap.add_argument("--serve-lean", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.serve_lean:
        _serve_lean()
        return
    cmd = ([sys.executable, "-m", "specctl.bench.stub_server", "--port", "0"] if args.stub == "aiohttp"
           else [sys.executable, __file__, "--serve-lean"])
    stub = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert stub.stdout is not None
        url = stub.stdout.readline().strip()
        if not url.startswith("http://"):
            raise SystemExit(f"stub server did not start (got {url!r})")
        cpu0 = _proc_cpu_s(stub.pid)
        res = asyncio.run(_measure(url, args.rate, args.num, args.seed))
        # The stub served both variants (plus a 32-request warm-up): its CPU per request.
        stub_cpu_ms = 1000.0 * (_proc_cpu_s(stub.pid) - cpu0) / (3 * args.num + 32)
    finally:
        if stub.stdin:
            stub.stdin.close()
        try:
            stub.wait(10)
        except subprocess.TimeoutExpired:
            stub.kill()
    spec, naive = res["specctl"], res["naive"]
    assert isinstance(spec, dict) and isinstance(naive, dict)
    print(f"target {args.rate:g} req/s, {args.num} requests, cpus={os.cpu_count()}, "
          f"loadavg={os.getloadavg()[0]:.2f}; {args.stub} stub in a separate process on the same cores")
    print(f"{'client':<10}{'achieved req/s':>16}{'x target':>10}{'added p50 ms':>14}{'added p99 ms':>14}"
          f"{'send p99 ms':>13}{'cpu ms/req':>12}{'errors':>8}")
    for name, r in (("specctl", spec), ("naive", naive), ("raw floor", res["floor"])):
        print(f"{name:<10}{r['achieved_rate']:>16.2f}{r['achieved_rate'] / args.rate:>10.4f}"
              f"{r['client_added_p50_ms']:>14.3f}{r['client_added_p99_ms']:>14.3f}{r['send_delay_p99_ms']:>13.3f}"
              f"{r['cpu_ms_per_request']:>12.3f}{r['errors']:>8}")
    print(f"stub CPU per request {stub_cpu_ms:.3f} ms (competes for the same cores); "
          f"client {spec['cpu_ms_per_request']:.3f} ms")
    print(f"send lateness p50 {spec['send_delay_p50_ms']:.3f} ms")
    print(f"legs of the added latency at p99 (ms): send lateness {spec['send_delay_p99_ms']:.3f}, "
          f"client send -> stub receive {spec['to_stub_p99_ms']:.3f}, "
          f"stub first write -> client first token {spec['from_stub_p99_ms']:.3f}")
    summary = {
        "target_rate": args.rate, "num_requests": args.num, "cpus": os.cpu_count(),
        "loadavg_1m": round(os.getloadavg()[0], 2), "stub": args.stub, "stub_separate_process": True,
        "achieved_ratio": spec["achieved_rate"] / args.rate,
        "naive_achieved_ratio": naive["achieved_rate"] / args.rate,
        "floor_achieved_ratio": res["floor"]["achieved_rate"] / args.rate,
        "floor_added_p50_ms": res["floor"]["client_added_p50_ms"],
        "floor_added_p99_ms": res["floor"]["client_added_p99_ms"],
        "client_added_p50_ms": spec["client_added_p50_ms"], "client_added_p99_ms": spec["client_added_p99_ms"],
        "send_delay_p50_ms": spec["send_delay_p50_ms"],
        "send_delay_p99_ms": spec["send_delay_p99_ms"], "to_stub_p99_ms": spec["to_stub_p99_ms"],
        "from_stub_p99_ms": spec["from_stub_p99_ms"], "errors": spec["errors"],
        "client_cpu_ms_per_request": spec["cpu_ms_per_request"],
        "client_cpu_share_at_target": spec["cpu_ms_per_request"] * args.rate / 1000.0,
        "stub_cpu_ms_per_request": stub_cpu_ms,
        "rate_target_met": spec["achieved_rate"] >= 0.99 * args.rate,
        "latency_target_met": spec["client_added_p99_ms"] < 1.0,
    }
    print(json.dumps(summary))


if __name__ == "__main__":
    main()
