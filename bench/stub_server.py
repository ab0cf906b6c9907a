"""A stub OpenAI-compatible server whose timing and faults the caller controls (tests, benchmarks).

`StubServer(behaviour)` serves on 127.0.0.1 (port 0 unless given) from a background thread with its
own event loop: `/v1/completions` and `/v1/chat/completions` (SSE streaming and plain JSON),
`/v1/models`, `/server_info`, `/metrics` and `/stub/log` (its own per-request timestamps as JSON).
`python -m specctl.bench.stub_server --port 0 [--ttft S --itl S]` runs one as a process and prints
its URL on the first stdout line.

`StubBehaviour` sets the time to first chunk, the gap between chunks, a whole-server stall (the
loop thread blocks, like a hung engine step, at the arrival of request number `stall_at_request`),
and per-request faults by arrival index: `http500`, `broken` (the connection is cut after the first
chunk), `slow` (nothing is sent for `slow_s`, so the client times out), `bad_json`. Responses carry
`usage` with token counts and speculative fields (`spec_verify_steps`, `spec_accepted_tokens`,
`accept_lengths`: accepted draft tokens per verify step, cycling through `accept_pattern`) and, when
set, per-request `timings`; streams send the usage chunk (`choices: []`) only with
`stream_options.include_usage`, as OpenAI does (timings then ride on the finishing chunk). With `switch_every=k`,
every k-th request adds an adaptive step switch
(stamped with `time.monotonic()`, cycling steps 1 -> 3 -> 5) to `/server_info`'s timeline. Log
timestamps are `time.perf_counter()` (CLOCK_MONOTONIC on Linux, so comparable with a client's in
another process on the same machine).
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import json
import sys
import threading
import time
from typing import Any

from aiohttp import web

FAULTS = ("http500", "broken", "slow", "bad_json")


@dataclasses.dataclass(frozen=True)
class StubBehaviour:
    ttft_s: float = 0.0
    itl_s: float = 0.0
    tokens_per_chunk: int = 1
    default_max_tokens: int = 16
    stall_at_request: int | None = None
    stall_s: float = 0.0
    faults: dict[int, str] = dataclasses.field(default_factory=dict)
    slow_s: float = 30.0
    accept_pattern: tuple[int, ...] = (2, 1, 3, 0)
    num_steps: int = 3
    timings: dict[str, float] | None = None
    server_info: bool = True
    switch_every: int | None = None
    model: str = "stub-model"


@dataclasses.dataclass
class StubRecord:
    index: int
    id: str
    recv: float
    first_write: float | None = None
    end: float | None = None
    fault: str | None = None


class StubServer:
    """Context manager running the stub in a thread; `.url`, `.log`, `.behaviour` (settable)."""

    def __init__(self, behaviour: StubBehaviour | None = None, *, host: str = "127.0.0.1", port: int = 0) -> None:
        self.behaviour = behaviour or StubBehaviour()
        self._host, self._port = host, port
        self.log: list[StubRecord] = []
        self.switches: list[dict[str, Any]] = []
        self._count = 0
        self._tokens = 0
        self._loop: asyncio.AbstractEventLoop | None = None
        self._runner: web.AppRunner | None = None
        self._ready = threading.Event()
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._main, name="specctl-stub-server", daemon=True)
        self.url = ""

    # lifecycle -----------------------------------------------------------------------------------
    def __enter__(self) -> StubServer:
        self._thread.start()
        if not self._ready.wait(10):
            raise RuntimeError("stub server did not start within 10 s")
        if self._error:
            raise RuntimeError(f"stub server failed to start: {self._error}")
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        if self._loop is not None and self._thread.is_alive():
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(15)

    def reset(self, behaviour: StubBehaviour | None = None) -> None:
        """Forget the log and restart arrival numbering (for faults/stalls), optionally with new behaviour."""
        if behaviour is not None:
            self.behaviour = behaviour
        self.log = []
        self.switches = []
        self._count = 0

    def _main(self) -> None:
        loop = asyncio.new_event_loop()
        self._loop = loop
        try:
            loop.run_until_complete(self._start())
        except BaseException as exc:  # reported to the starting thread
            self._error = exc
            self._ready.set()
            loop.close()
            return
        self._ready.set()
        try:
            loop.run_forever()
        finally:
            assert self._runner is not None
            loop.run_until_complete(self._runner.cleanup())
            pending = [t for t in asyncio.all_tasks(loop) if not t.done()]
            for task in pending:
                task.cancel()
            if pending:
                loop.run_until_complete(asyncio.gather(*pending, return_exceptions=True))
            loop.run_until_complete(loop.shutdown_asyncgens())
            loop.close()

    async def _start(self) -> None:
        app = web.Application()
        app.router.add_post("/v1/completions", self._completions)
        app.router.add_post("/v1/chat/completions", self._chat)
        app.router.add_get("/v1/models", self._models)
        app.router.add_get("/server_info", self._server_info)
        app.router.add_get("/metrics", self._metrics)
        app.router.add_get("/stub/log", self._log)
        app.router.add_get("/health", self._health)
        self._runner = web.AppRunner(app, access_log=None, shutdown_timeout=0.5)
        await self._runner.setup()
        site = web.TCPSite(self._runner, self._host, self._port)
        await site.start()
        host, port = self._runner.addresses[0][:2]
        self.url = f"http://{host}:{port}"

    # handlers --------------------------------------------------------------------------------------
    async def _health(self, request: web.Request) -> web.Response:
        return web.Response(text="ok")

    async def _models(self, request: web.Request) -> web.Response:
        return web.json_response({"object": "list", "data": [{"id": self.behaviour.model, "object": "model"}]})

    async def _server_info(self, request: web.Request) -> web.Response:
        if not self.behaviour.server_info:
            return web.Response(status=404, text="not found")
        b = self.behaviour
        mean = sum(b.accept_pattern) / len(b.accept_pattern) if b.accept_pattern else 0.0
        return web.json_response({
            "fingerprint": "stub-fingerprint-0001",
            "speculative": {
                "algorithm": "draft", "num_steps": b.num_steps,
                "adaptive": {"switches": list(self.switches)},
                "time_per_step_ms": {str(b.num_steps): round(b.itl_s * 1000 * (mean + 1), 3)},
                "avg_accept_length": mean + 1,
            },
            # SGLang's own shape: bench_serving reads the accept length here (and then counts ITL per token)
            "internal_states": [{"avg_spec_accept_length": mean + 1}],
        })

    async def _metrics(self, request: web.Request) -> web.Response:
        text = ("# HELP stub_requests_total Requests received.\n# TYPE stub_requests_total counter\n"
                f"stub_requests_total {self._count}\n"
                "# TYPE stub_generated_tokens_total counter\n"
                f"stub_generated_tokens_total {self._tokens}\n"
                "# TYPE stub_running_requests gauge\nstub_running_requests 0\n")
        return web.Response(text=text, content_type="text/plain")

    async def _log(self, request: web.Request) -> web.Response:
        return web.json_response([dataclasses.asdict(r) for r in self.log])

    async def _completions(self, request: web.Request) -> web.StreamResponse:
        return await self._generate(request, chat=False)

    async def _chat(self, request: web.Request) -> web.StreamResponse:
        return await self._generate(request, chat=True)

    async def _generate(self, request: web.Request, *, chat: bool) -> web.StreamResponse:
        recv = time.perf_counter()
        b = self.behaviour
        index = self._count
        self._count += 1
        record = StubRecord(index, f"stub-{index}", recv, fault=b.faults.get(index))
        self.log.append(record)
        if b.switch_every and index % b.switch_every == 0:
            cycle = (1, 3, 5)
            prev = self.switches[-1]["to_steps"] if self.switches else b.num_steps
            nxt = cycle[(cycle.index(prev) + 1) % 3] if prev in cycle else cycle[0]
            self.switches.append({"time": time.monotonic(), "bucket": 1, "from_steps": prev, "to_steps": nxt,
                                  "ema": float(nxt) - 0.5})
        if b.stall_at_request == index and b.stall_s > 0:
            # Block the whole server thread, as a hung engine step would: nothing is read or sent.
            time.sleep(b.stall_s)
        try:  # a malformed request is the client's error (400), never a 500 with a logged traceback
            body = await request.json()
            n = int(body.get("max_tokens") or b.default_max_tokens)
            usage = self._usage(n, body)
        except (ValueError, TypeError, AttributeError, RecursionError) as exc:
            return web.json_response({"error": {"message": f"bad request body: {exc}"}}, status=400)
        if record.fault == "http500":
            return web.Response(status=500, text="injected failure")
        if not body.get("stream", False):
            await asyncio.sleep(b.ttft_s + b.itl_s * max(0, n - 1))
            record.first_write = record.end = time.perf_counter()
            self._tokens += n
            msg = {"role": "assistant", "content": "x" * n}
            choice = {"index": 0, "finish_reason": "length", **({"message": msg} if chat else {"text": "x" * n})}
            out: dict[str, Any] = {"id": record.id, "object": "text_completion", "choices": [choice], "usage": usage}
            if b.timings:
                out["timings"] = b.timings
            return web.json_response(out)
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"})
        await resp.prepare(request)
        try:
            options = body.get("stream_options")
            include_usage = isinstance(options, dict) and options.get("include_usage") is True
            await self._stream(request, resp, record, n, usage, chat=chat, include_usage=include_usage)
        except ConnectionResetError:
            pass  # the client went away (timed out, or stopped reading after a fault): nothing to do
        return resp

    async def _stream(self, request: web.Request, resp: web.StreamResponse, record: StubRecord, n: int,
                      usage: dict[str, Any], *, chat: bool, include_usage: bool) -> None:
        b = self.behaviour
        if record.fault == "slow":
            await asyncio.sleep(b.slow_s)
        if b.ttft_s > 0:
            await asyncio.sleep(b.ttft_s)
        sent = 0
        first = True
        while sent < n:
            if not first and b.itl_s > 0:
                await asyncio.sleep(b.itl_s)
            k = min(b.tokens_per_chunk, n - sent)
            sent += k
            text = "x" * k
            choice = {"index": 0, "delta": {"content": text}} if chat else {"index": 0, "text": text}
            choice["finish_reason"] = "length" if sent >= n else None
            chunk: dict[str, Any] = {"id": record.id, "object": "chunk", "choices": [choice]}
            if sent >= n and b.timings and not include_usage:
                chunk["timings"] = b.timings
            # Stamped before the write: the client may read the chunk before this thread runs again.
            stamp = time.perf_counter()
            await resp.write(_sse(chunk))
            if first:
                record.first_write = stamp
                first = False
                if record.fault == "broken":
                    # Cut the connection mid-stream: the chunked body never terminates.
                    assert request.transport is not None
                    request.transport.abort()
                    return
                if record.fault == "bad_json":
                    await resp.write(b"data: {not json\n\n")
        self._tokens += n
        if include_usage:  # OpenAI's shape: usage once, on a last chunk without choices, only when asked
            final: dict[str, Any] = {"id": record.id, "object": "chunk", "choices": [], "usage": usage}
            if b.timings:
                final["timings"] = b.timings
            await resp.write(_sse(final))
        record.end = time.perf_counter()
        await resp.write(b"data: [DONE]\n\n")
        await resp.write_eof()

    def _usage(self, n: int, body: dict[str, Any]) -> dict[str, Any]:
        prompt = body.get("prompt")
        if prompt is None:
            prompt = "".join(str(m.get("content", "")) for m in body.get("messages", []))
        usage: dict[str, Any] = {"prompt_tokens": len(str(prompt).encode()), "completion_tokens": n,
                                 "total_tokens": len(str(prompt).encode()) + n}
        pattern = self.behaviour.accept_pattern
        if pattern:
            # Each verify step yields its accepted drafts plus one token from the target.
            accepted: list[int] = []
            produced = 1  # the first token comes from prefill
            while produced < n:
                a = pattern[len(accepted) % len(pattern)]
                accepted.append(a)
                produced += a + 1
            usage.update(spec_verify_steps=len(accepted), spec_accepted_tokens=sum(accepted),
                         accept_lengths=accepted)
        return usage


def _sse(obj: dict[str, Any]) -> bytes:
    return b"data: " + json.dumps(obj).encode() + b"\n\n"


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description="specctl stub OpenAI-compatible server (tests, benchmarks)")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=0)
    parser.add_argument("--ttft", type=float, default=0.0, help="seconds to the first chunk")
    parser.add_argument("--itl", type=float, default=0.0, help="seconds between chunks")
    parser.add_argument("--tokens-per-chunk", type=int, default=1, help="tokens per chunk (speculation: > 1)")
    args = parser.parse_args(argv)
    behaviour = StubBehaviour(ttft_s=args.ttft, itl_s=args.itl, tokens_per_chunk=args.tokens_per_chunk)
    with StubServer(behaviour, host=args.host, port=args.port) as stub:
        print(stub.url, flush=True)
        # Serve until stdin closes (the parent exits or closes the pipe) or SIGTERM/Ctrl-C.
        try:
            sys.stdin.read()
        except KeyboardInterrupt:
            pass


if __name__ == "__main__":
    main()
