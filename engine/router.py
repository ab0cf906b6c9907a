"""RouterBackend: the OpenAI front of a disaggregated deployment.

Contract: health-checks prefill and decode over HTTP every `HEALTH_POLL_S` (decode's /health advertises
its ZMQ control endpoint and the prefill it is paired with); `/health` is 200 only while both are up and
paired, else 503 naming the role that is down. Each request is tokenized here and dispatched to the
decode paired with the (healthy) prefill as a `PdGenerate`; decode pulls the prompt's KV from prefill
and streams `PdTokens` back on the same DEALER socket. A request fails with a clear error (never hangs)
when decode goes down, when the stream stalls past the transfer timeout, or when a role is unhealthy at
dispatch. A client that goes away aborts the request on decode (which aborts it on prefill).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import zmq
import zmq.asyncio

from specctl.engine import wire
from specctl.engine.async_engine import RequestOutput
from specctl.engine.metrics import ServingMetrics
from specctl.engine.pd_protocol import PdAbort, PdGenerate, PdTokens
from specctl.engine.roles import HEALTH_POLL_S, RoleContext, TokenizingBackend, new_id

log = logging.getLogger("specctl.router")


class _Peer:
    """Last known health of one role."""

    def __init__(self, name: str, url: str) -> None:
        self.name = name
        self.url = url
        self.ok = False
        self.status = "unknown"
        self.detail = "not contacted yet"
        self.body: dict[str, Any] = {}
        self.last_ok: float | None = None

    def to_json(self) -> dict[str, Any]:
        return {"url": self.url, "ok": self.ok, "status": self.status, "detail": self.detail}


class RouterBackend(TokenizingBackend):
    supports_logit_processors = True  # decode and prefill apply them (engine/penalties.py); logprobs: not yet

    def __init__(self, ctx: RoleContext) -> None:
        dep = ctx.deployment
        pre, dec = dep.role("prefill"), dep.role("decode")
        super().__init__(ctx, dec)
        self.timeout_s = float((dec.get("transfer") or {}).get("timeout_s", 30))
        self.prefill = _Peer("prefill", f"http://{_http_host(pre)}:{pre['port']}")
        self.decode_peer = _Peer("decode", f"http://{_http_host(dec)}:{dec['port']}")
        self._ctx = zmq.asyncio.Context()
        self._sock: zmq.asyncio.Socket | None = None
        self._endpoint: str | None = None
        self._retired: list[zmq.asyncio.Socket] = []
        self._streams: dict[str, asyncio.Queue] = {}
        self._tasks: list[asyncio.Task] = []
        self._session: aiohttp.ClientSession | None = None
        self.dispatched = 0

    async def load(self) -> None:
        from specctl.engine.tokenizer import load_tokenizer
        from specctl.schemas.model_facts import resolve_model_dir

        self.tokenizer = load_tokenizer(resolve_model_dir(self.model_name))
        self._session = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=2.0))
        self._tasks.append(asyncio.create_task(self._health_loop()))
        self._tasks.append(asyncio.create_task(self._recv_loop()))
        self.ctx.state.set("waiting", "waiting for prefill and decode")

    # Backend protocol -----------------------------------------------------------------------------
    def health(self) -> tuple[bool, dict[str, Any]]:
        ready, detail = self.ctx.state.health()
        detail = {**detail, "roles": {p.name: p.to_json() for p in (self.prefill, self.decode_peer)}}
        return ready, detail

    async def generate(self, prompt_ids: list[int], params: dict[str, Any]) -> AsyncIterator[RequestOutput]:
        sock = self._sock
        if sock is None or not self.ctx.state.ready:
            yield RequestOutput([], True, "error", f"not ready: {self._down_reason()}")
            return
        req_id = new_id()
        q: asyncio.Queue = asyncio.Queue()
        self._streams[req_id] = q
        t0 = time.perf_counter()
        finished = False
        try:
            frames = wire.encode(PdGenerate(req_id=req_id, prompt_ids=list(prompt_ids), params=params))
            await asyncio.wait_for(sock.send_multipart(frames), self.timeout_s)
            self.dispatched += 1
            count = 0
            while True:
                try:
                    # Decode answers at least every KEEPALIVE_S while a request waits, and prefill +
                    # transfer + one decode step fit the transfer timeout (plus slack for a busy decode):
                    # a silent decode fails the request instead of hanging it.
                    item = await asyncio.wait_for(q.get(), self.timeout_s + 10.0)
                except asyncio.TimeoutError:
                    yield RequestOutput([], True, "error",
                                        f"decode sent nothing for {self.timeout_s + 10:g}s (request {req_id})", count)
                    return
                if isinstance(item, str):  # the router noticed decode went down
                    yield RequestOutput([], True, "error", item, count)
                    finished = True
                    return
                msg: PdTokens = item
                if not msg.finished and not msg.token_ids:
                    continue  # decode's keepalive while the request waits (prefill queue, batch slot)
                count = msg.completion_tokens
                timings = dict(msg.timings)
                if msg.finished:
                    timings["router_total_s"] = time.perf_counter() - t0
                    finished = True
                yield RequestOutput(list(msg.token_ids), msg.finished, msg.finish_reason, msg.error, count,
                                    list(msg.accept_lengths), timings, text=msg.text)
                if msg.finished:
                    return
        finally:
            self._streams.pop(req_id, None)
            if not finished and self._sock is sock and not sock.closed:
                with contextlib.suppress(Exception):
                    await sock.send_multipart(wire.encode(PdAbort(req_id=req_id, reason="client went away")))

    async def server_info(self) -> dict[str, Any]:
        info = self.ctx.base_info()
        info["roles"] = {}
        for peer in (self.prefill, self.decode_peer):
            entry = peer.to_json()
            with contextlib.suppress(Exception):
                assert self._session is not None
                async with self._session.get(peer.url + "/server_info") as r:
                    entry["server_info"] = await r.json()
            info["roles"][peer.name] = entry
        dec_info = (info["roles"].get("decode") or {}).get("server_info") or {}
        pre_info = (info["roles"].get("prefill") or {}).get("server_info") or {}
        info["fingerprints"] = {"prefill": pre_info.get("fingerprints"), "decode": dec_info.get("fingerprints")}
        info["adaptive"] = dec_info.get("adaptive")
        info["timing"] = {"router": {"dispatched": self.dispatched}, "prefill": pre_info.get("timing"),
                          "decode": dec_info.get("timing")}
        info["decode_endpoint"] = self._endpoint
        return info

    async def refresh_metrics(self, metrics: ServingMetrics) -> None:
        # Transfer bytes/time and steps are recorded by prefill/decode; the router exposes its own
        # request-level view and mirrors decode's adaptive steps for convenience.
        with contextlib.suppress(Exception):
            assert self._session is not None
            async with self._session.get(self.decode_peer.url + "/server_info") as r:
                info = await r.json()
            for key, steps in ((info.get("adaptive") or {}).get("buckets") or {}).items():
                value = steps.get("steps") if isinstance(steps, dict) else steps
                if isinstance(value, (int, float)):
                    metrics.adaptive_steps.set(value, bucket=str(key))

    async def mirrored_metrics(self) -> tuple[str, str]:
        """Prefill's transfer metrics (bytes, seconds, failures), shown on the router's /metrics so one
        scrape of the API endpoint covers the whole deployment."""
        from specctl.engine.metrics import families

        text = ""
        with contextlib.suppress(Exception):
            assert self._session is not None
            async with self._session.get(self.prefill.url + "/metrics") as r:
                if r.status == 200:
                    text = families(await r.text(), "specctl_transfer_")
        return "specctl_transfer_", text

    async def close(self) -> None:
        for t in self._tasks:
            t.cancel()
        for t in self._tasks:
            with contextlib.suppress(BaseException):
                await t
        self._fail_all("router shutting down")
        if self._session is not None:
            await self._session.close()
        if self._sock is not None:
            self._sock.close(linger=0)
        self._ctx.destroy(linger=0)

    # internals -----------------------------------------------------------------------------------
    def _down_reason(self) -> str:
        down = [p for p in (self.prefill, self.decode_peer) if not p.ok]
        if not down:
            return self.ctx.state.detail or self.ctx.state.status
        return "; ".join(f"{p.name} is {p.status} ({p.detail}) at {p.url}" for p in down)

    def _fail_all(self, reason: str) -> None:
        for q in self._streams.values():
            q.put_nowait(reason)

    async def _probe(self, peer: _Peer) -> None:
        assert self._session is not None
        try:
            async with self._session.get(peer.url + "/health") as r:
                body = await r.json(content_type=None)
                peer.body = body if isinstance(body, dict) else {}
                peer.ok = r.status == 200
                peer.status = str(peer.body.get("status", r.status))
                peer.detail = str(peer.body.get("detail", ""))
        except (aiohttp.ClientError, asyncio.TimeoutError, ValueError) as exc:
            peer.ok = False
            peer.status = "down"
            peer.detail = f"unreachable ({type(exc).__name__})"
        if peer.ok:
            peer.last_ok = time.monotonic()

    async def _health_loop(self) -> None:
        while True:
            await asyncio.gather(self._probe(self.prefill), self._probe(self.decode_peer))
            endpoint = self.decode_peer.body.get("control_endpoint") if self.decode_peer.ok else None
            if endpoint and endpoint != self._endpoint:
                self._connect(endpoint)
            if not self.decode_peer.ok and self._streams:
                # Decode is gone: its in-flight requests will never finish; say so now.
                self._fail_all(f"decode went down mid-request: {self.decode_peer.detail}")
            ready = self.prefill.ok and self.decode_peer.ok and self._sock is not None
            if ready:
                self.ctx.state.set("ready", ready=True)
            else:
                self.ctx.state.set("degraded" if self.ctx.state.ready or self.dispatched else "waiting",
                                   self._down_reason())
            await asyncio.sleep(HEALTH_POLL_S)

    def _connect(self, endpoint: str) -> None:
        old = self._sock
        sock = self._ctx.socket(zmq.DEALER)
        sock.setsockopt(zmq.LINGER, 0)
        sock.connect(endpoint)
        self._sock, self._endpoint = sock, endpoint
        if old is not None:
            self._fail_all("decode restarted mid-request")
            # Closed by the receive loop, which may be awaiting it right now (closing a socket under a
            # pending zmq.asyncio poll leaves that await hanging forever).
            self._retired.append(old)
        log.info("connected to decode control endpoint %s", endpoint)

    async def _recv_loop(self) -> None:
        while True:
            while self._retired:
                self._retired.pop().close(linger=0)
            sock = self._sock
            if sock is None or sock.closed:
                await asyncio.sleep(0.05)
                continue
            # Poll with a timeout so a socket swapped by a decode restart is picked up.
            try:
                if not await sock.poll(200, zmq.POLLIN):
                    continue
                frames = await sock.recv_multipart(copy=False)
            except zmq.ZMQError:
                continue  # the socket was closed under us (decode restarted): take the new one
            try:
                env = wire.decode(frames, as_torch=False, expect=(PdTokens,))
            except wire.WireError as exc:
                log.warning("dropping a bad message from decode: %s", exc)
                continue
            msg = env.msg
            q = self._streams.get(msg.req_id)  # type: ignore[attr-defined]
            if q is not None:
                q.put_nowait(msg)


def _http_host(role: dict[str, Any]) -> str:
    host = str(role.get("host") or "127.0.0.1")
    return "127.0.0.1" if host in ("0.0.0.0", "::") else host
