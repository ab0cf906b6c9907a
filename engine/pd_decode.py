"""DecodeBackend: the decode role of a disaggregated deployment.

Contract:
- Loads the Engine (target runner + the configured decoder: speculative when `speculative.algorithm`
  is not none), binds W's `TransferReceiver` and a ZMQ control socket for the router, builds its
  RegistrationInfo from the live layouts (`endpoints`: transfer, control) and registers with prefill's
  bootstrap endpoint. Until accepted, /health is 503 (`pairing`). A refusal prints the itemized diff as
  a table on stderr, logs it as one JSON line, and the process exits 3, never having answered 200.
- A heartbeat pings prefill every `HEARTBEAT_S`; a prefill that stops answering (or restarted) makes
  decode 503 again, fails the requests waiting on it at once, and re-registers until prefill is back.
- Per `PdGenerate` from the router: send `PdPrefill` to prefill, wait for the payload. The transfer timeout
  measures liveness, not queueing: prefill acknowledges the request at once (`queued`) and reports when its
  compute starts (`started`); the timeout runs from sending until the acknowledgement, from `started` until
  the payload, and, while queued, from prefill's last progress on any request (a dead prefill is also
  caught by the heartbeat). While a request waits (prefill queue, or a free decode batch slot) decode sends
  the router empty keepalive `PdTokens` so its own timeout does not fire. Then
  import it into the engine (target KV + state; draft KV into the drafter's cache when present) with
  prefill's first token and generator state, then stream `PdTokens` back. Every failure finishes the
  request with an error naming it; aborts propagate to prefill; imported pages are freed by the engine.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import sys
import threading
import time
from typing import Any

import zmq
import zmq.asyncio

from specctl.engine import wire
from specctl.engine.metrics import TokenClock
from specctl.engine.pd_protocol import (
    PdAbort,
    PdGenerate,
    PdPrefill,
    PdPrefillDone,
    PdPrefillProgress,
    PdTokens,
    serve_requests,
)
from specctl.engine.roles import EngineBackend, RoleContext, sampling_params_of

log = logging.getLogger("specctl.decode")

HEARTBEAT_S = 1.0
KEEPALIVE_S = 1.0  # how often a waiting request tells the router it is still alive
MISSED_PINGS = 2  # consecutive unanswered pings before prefill counts as gone


class DecodeBackend(EngineBackend):
    supports_logprobs = False  # the first token is prefill's, whose log-prob does not travel (yet)
    supports_logit_processors = True  # prefill applies logit_bias to the first token, decode the rest

    def __init__(self, ctx: RoleContext) -> None:
        super().__init__(ctx)
        self.fatal = asyncio.Event()
        self.pairing: Any = None
        self.info: Any = None
        self.receiver: Any = None
        self._zctx = zmq.asyncio.Context()
        self._router_sock: zmq.asyncio.Socket | None = None
        self._prefill_sock: zmq.asyncio.Socket | None = None
        self._waiting: dict[str, asyncio.Future] = {}
        self._stage: dict[str, tuple[str, float]] = {}  # req_id -> (prefill stage, loop time it was reported)
        self._prefill_progress_at = 0.0  # loop time of prefill's latest sign of progress on any request
        self._tasks: dict[str, asyncio.Task] = {}
        self._bg: list[asyncio.Task] = []
        self._stop = threading.Event()
        self._recv_thread: threading.Thread | None = None
        self.handshakes = 0
        self.handshake_latency_s: float | None = None
        self.imported = 0
        self.failed = 0

    # lifecycle ------------------------------------------------------------------------------------
    async def load(self) -> None:
        from specctl.engine.registration import build_registration
        from specctl.engine.transfer import PayloadSpec, TransferReceiver

        await super().load()
        self.loop = asyncio.get_running_loop()
        # Admission never exceeds the batch: a request whose KV arrived waits here for a running slot.
        self._batch_slots = asyncio.Semaphore(self.engine.config.max_batch_size)
        host = str(self.ctx.role.get("host") or "127.0.0.1")
        transfer = self.ctx.transfer
        backend = str(transfer.get("backend", "zmq"))
        bind = f"tcp://{host}:0"
        if transfer.get("protocol") == "ipc":
            import tempfile

            bind = f"ipc://{tempfile.gettempdir()}/specctl-decode-{id(self):x}.ipc"
        self.receiver = TransferReceiver(None, bind=bind, timeout_s=self.ctx.timeout_s)
        self._router_sock = self._zctx.socket(zmq.ROUTER)
        self._router_sock.setsockopt(zmq.LINGER, 0)
        self._router_sock.bind(f"tcp://{host}:0")
        control = self._router_sock.getsockopt_string(zmq.LAST_ENDPOINT)
        runner = self.engine.runner
        draft_runner = _draft_runner(self.engine)
        self.info = build_registration(
            "decode", runner.layout(), speculative=self.engine.config.speculative,
            draft_layout=draft_runner.layout() if draft_runner is not None else None,
            transfer_backend=backend, endpoints={"transfer": self.receiver.endpoint, "control": control},
            facts=runner.facts, draft_facts=draft_runner.facts if draft_runner is not None else None,
        )  # fmt: skip
        # Every payload is checked against the registration (component names, order, dtypes, item sizes
        # and counts) before it is acknowledged; a mismatch fails that request naming the field.
        self.receiver.set_spec(PayloadSpec.from_registration(self.info))
        self.ctx.state.extra.update({"fingerprint": self.info.fingerprint()})
        self._control_endpoint = control
        self._recv_thread = threading.Thread(target=self._receive_loop, name="specctl-transfer-recv", daemon=True)
        self._recv_thread.start()
        self._bg.append(asyncio.create_task(self._router_loop()))
        self._bg.append(asyncio.create_task(self._pair_loop()))

    async def close(self) -> None:
        self._stop.set()
        for t in list(self._tasks.values()) + self._bg:
            t.cancel()
        for t in list(self._tasks.values()) + self._bg:
            with contextlib.suppress(BaseException):
                await t
        if self._recv_thread is not None:
            await asyncio.to_thread(self._recv_thread.join, 2.0)
        if self.receiver is not None:
            self.receiver.close()
        for s in (self._router_sock, self._prefill_sock):
            if s is not None:
                s.close(linger=0)
        self._zctx.destroy(linger=0)
        await super().close()

    # pairing --------------------------------------------------------------------------------------
    def _bootstrap_endpoint(self) -> str:
        pre = self.ctx.deployment.role("prefill")
        host = str(pre.get("host") or "127.0.0.1")
        if host in ("0.0.0.0", "::"):
            host = "127.0.0.1"
        return f"tcp://{host}:{pre['bootstrap_port']}"

    async def _register(self) -> None:
        """Register until accepted (prefill may not be up yet); a refusal is fatal."""
        from specctl.engine.bootstrap import HandshakeRejected, register
        from specctl.engine.pd_prefill import _secret
        from specctl.engine.wire import WireTimeout

        endpoint = self._bootstrap_endpoint()
        secret = _secret(self.ctx)
        attempt = 0
        while True:
            attempt += 1
            self.ctx.state.set("pairing", f"registering with prefill at {endpoint} (attempt {attempt})")
            try:
                pairing = await asyncio.to_thread(register, endpoint, self.info, secret=secret,
                                                  timeout_s=min(5.0, self.ctx.timeout_s), retries=1)
            except HandshakeRejected as exc:
                self._refused(exc)
                return
            except (WireTimeout, wire.WireError) as exc:
                log.info("prefill not answering yet: %s", exc)
                await asyncio.sleep(0.5)
                continue
            self._paired(pairing)
            return

    def _refused(self, exc: Any) -> None:
        self.ctx.state.set("refused", exc.reason)
        print(f"decode: {exc}", file=sys.stderr, flush=True)
        log.error("handshake refused: %s", json.dumps({"event": "handshake_refused", **exc.to_json()},
                                                      default=str))
        from specctl.errors import RuntimeFailure

        self.ctx.state.fatal = RuntimeFailure(
            f"decode refused by prefill: {exc.reason}",
            hint="the diff above lists every field that differs; fix them and restart decode")
        self.fatal.set()

    def _paired(self, pairing: Any) -> None:
        old = self.pairing
        self.pairing = pairing
        self.handshakes += 1
        self.handshake_latency_s = pairing.latency_s
        control = pairing.prefill.endpoints.get("control")
        if old is None or old.prefill.endpoints.get("control") != control or self._prefill_sock is None:
            # The previous socket's receive loop closes it once it sees it was replaced.
            sock = self._zctx.socket(zmq.DEALER)
            sock.setsockopt(zmq.LINGER, 0)
            sock.connect(control)
            self._prefill_sock = sock
            self._bg.append(asyncio.create_task(self._prefill_loop(sock)))
        self.ctx.state.extra.update({"control_endpoint": self._control_endpoint, "paired_with": pairing.endpoint,
                                     "prefill_fingerprint": pairing.prefill.fingerprint()})
        self.ctx.state.set("ready", ready=True)
        log.info("paired with prefill %s in %.3fs (fingerprint %s)", pairing.endpoint, pairing.latency_s,
                 pairing.prefill.fingerprint())

    async def _pair_loop(self) -> None:
        from specctl.engine.bootstrap import ping

        await self._register()
        missed = 0
        while not self.fatal.is_set():
            await asyncio.sleep(HEARTBEAT_S)
            try:
                ok = await asyncio.to_thread(ping, self.pairing, timeout_s=1.0, retries=1)
                missed = 0
            except wire.WireError:
                missed += 1
                if missed < MISSED_PINGS:
                    continue
                ok = False
            if ok:
                continue
            reason = "prefill stopped answering" if missed else "prefill restarted or dropped the pairing"
            log.warning("%s; re-registering", reason)
            self.ctx.state.set("pairing", reason)
            self.ctx.state.extra.pop("control_endpoint", None)
            self._fail_waiting(f"{reason} before the request's KV arrived")
            missed = 0
            await self._register()

    # router side ----------------------------------------------------------------------------------
    async def _router_loop(self) -> None:
        assert self._router_sock is not None
        await serve_requests(self._router_sock, PdGenerate, self._generate, self._tasks, what="the router")

    async def _to_router(self, identity: bytes, msg: PdTokens) -> None:
        assert self._router_sock is not None
        await asyncio.wait_for(self._router_sock.send_multipart([identity, *wire.encode(msg)]), 5.0)

    async def _generate(self, identity: bytes, msg: PdGenerate) -> None:
        req_id = msg.req_id
        t0 = time.perf_counter()
        timings: dict[str, float] = {}
        payload: Any = None
        got_payload = False
        finished = False
        slot = False
        try:
            if not self.ctx.state.ready or self._prefill_sock is None or self.pairing is None:
                raise _Fail(f"decode is not paired with prefill ({self.ctx.state.detail or self.ctx.state.status})")
            sp = sampling_params_of(msg.params)
            fut = self.loop.create_future()
            self._waiting[req_id] = fut
            draft = _draft_runner(self.engine) is not None
            request = PdPrefill(req_id=req_id, prompt_ids=list(msg.prompt_ids), params=msg.params,
                                pairing_id=self.pairing.session_id, with_draft=draft)
            await asyncio.wait_for(self._prefill_sock.send_multipart(wire.encode(request)), 5.0)
            payload = await self._await_payload(identity, req_id, fut)
            got_payload = True
            received = time.perf_counter()
            extra = payload.extra
            timings["prefill_wait_s"] = received - t0
            timings["prefill_s"] = float(extra.get("prefill_s", 0.0))
            timings["prefill_queue_s"] = float(extra.get("queue_s", 0.0))
            for key in ("prefill_target_s", "prefill_draft_s", "export_s"):
                if key in extra:
                    timings[key] = float(extra[key])
            timings["transfer_s"] = max(0.0, time.time() - float(extra.get("sent_at", time.time())))
            self.ctx.metrics.transfer_bytes.inc(payload.nbytes, direction="received")
            self.ctx.metrics.transfer_seconds.observe(timings["transfer_s"])
            clock = TokenClock(self.ctx.metrics)  # decode's own generation / ITL / acceptance counts
            await self._acquire_slot(identity, req_id)
            slot = True
            admit = _Admit(self, list(msg.prompt_ids), sp, payload)
            count = 0
            first_at: float | None = None
            async for item in self.aengine.generate(msg.prompt_ids, sp, admit=admit):
                if first_at is None:
                    first_at = time.perf_counter()
                    timings["decode_queue_s"] = first_at - received
                count = item.completion_tokens
                clock.tokens(len(item.token_ids))
                if item.finished:
                    clock.finish(item, prompt_tokens=None)  # prompt tokens are prefill's to count
                out = PdTokens(req_id=req_id, token_ids=list(item.token_ids), completion_tokens=count,
                               finished=item.finished, finish_reason=item.finish_reason, error=item.error,
                               accept_lengths=list(item.accept_lengths),
                               timings={**timings, **item.timings} if item.finished else {}, text=item.text)
                if item.finished:
                    out_t = dict(out.timings)
                    out_t["decode_total_s"] = time.perf_counter() - t0
                    out = PdTokens(**{**_fields(out), "timings": out_t})
                    finished = True
                    if item.finish_reason == "error":
                        self.failed += 1
                await self._to_router(identity, out)
                if item.finished:
                    return
        except _Fail as exc:
            self.failed += 1
            finished = True
            with contextlib.suppress(Exception):
                await self._to_router(identity, PdTokens(req_id=req_id, token_ids=[], finished=True,
                                                         finish_reason="error", error=str(exc)))
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            self.failed += 1
            finished = True
            log.exception("request %s failed on decode", req_id)
            with contextlib.suppress(Exception):
                await self._to_router(identity, PdTokens(req_id=req_id, token_ids=[], finished=True,
                                                         finish_reason="error",
                                                         error=f"decode failed: {type(exc).__name__}: {exc}"))
        finally:
            self._waiting.pop(req_id, None)
            self._stage.pop(req_id, None)
            self._tasks.pop(req_id, None)
            if slot:
                self._batch_slots.release()
            if payload is not None:
                payload.release()
            if not got_payload and not finished and self._prefill_sock is not None:
                # Aborted while prefill works on it: let prefill free its pages now.
                with contextlib.suppress(Exception):
                    await self._prefill_sock.send_multipart(wire.encode(PdAbort(req_id=req_id, reason="aborted")))

    async def _keepalive(self, identity: bytes, req_id: str) -> None:
        with contextlib.suppress(Exception):
            await self._to_router(identity, PdTokens(req_id=req_id, token_ids=[]))

    async def _await_payload(self, identity: bytes, req_id: str, fut: asyncio.Future) -> Any:
        """Wait for the request's payload; the timeout measures prefill's liveness (see the module doc)."""
        timeout = self.ctx.timeout_s
        sent_at = self.loop.time()
        while True:
            stage, since = self._stage.get(req_id, ("sent", sent_at))
            if stage == "queued":
                since = max(since, self._prefill_progress_at)
            remaining = since + timeout - self.loop.time()
            if remaining <= 0:
                raise _Fail(f"request {req_id}: " + {
                    "sent": f"prefill did not acknowledge the request within {timeout:g}s",
                    "queued": f"prefill made no progress for {timeout:g}s while the request was queued",
                }.get(stage, f"prefill sent no KV within {timeout:g}s of starting the request")
                    + " (transfer.timeout_s)")
            done, _ = await asyncio.wait({fut}, timeout=min(remaining, KEEPALIVE_S))
            if done:
                return fut.result()
            await self._keepalive(identity, req_id)

    async def _acquire_slot(self, identity: bytes, req_id: str) -> None:
        """Wait for a free decode batch slot, keeping the router's stream alive meanwhile."""
        acquire = asyncio.ensure_future(self._batch_slots.acquire())
        try:
            while True:
                done, _ = await asyncio.wait({acquire}, timeout=KEEPALIVE_S)
                if done:
                    return
                await self._keepalive(identity, req_id)
        except BaseException:
            if acquire.done() and not acquire.cancelled() and acquire.exception() is None:
                self._batch_slots.release()
            else:
                acquire.cancel()
            raise

    # prefill side ---------------------------------------------------------------------------------
    async def _prefill_loop(self, sock: zmq.asyncio.Socket) -> None:
        try:
            await self._prefill_messages(sock)
        finally:
            sock.close(linger=0)

    async def _prefill_messages(self, sock: zmq.asyncio.Socket) -> None:
        while sock is self._prefill_sock:  # until a re-pairing replaces it
            try:
                if not await sock.poll(300, zmq.POLLIN):
                    continue
                frames = await sock.recv_multipart(copy=False)
            except zmq.ZMQError:
                return
            try:
                env = wire.decode(frames, as_torch=False, expect=(PdPrefillDone, PdPrefillProgress))
            except wire.WireError as exc:
                log.warning("bad message from prefill: %s", exc)
                continue
            msg = env.msg
            now = self.loop.time()
            if isinstance(msg, PdPrefillProgress):
                if msg.req_id in self._waiting:
                    self._stage[msg.req_id] = (msg.stage, now)
                if msg.stage != "queued":
                    self._prefill_progress_at = now
                continue
            self._prefill_progress_at = now
            fut = self._waiting.get(msg.req_id)
            if fut is not None and not fut.done() and not msg.ok:
                fut.set_exception(_Fail(f"request {msg.req_id}: prefill failed: {msg.error}"))

    def _receive_loop(self) -> None:
        """Transfer receiver thread: hand each payload to the request waiting for it."""
        from specctl.engine.transfer import TransferError, TransferTimeout

        while not self._stop.is_set():
            try:
                payload = self.receiver.recv(timeout_s=0.25)
            except TransferTimeout:
                continue
            except TransferError as exc:
                rid = getattr(exc, "request_id", None)
                log.warning("transfer rejected: %s", exc)
                if rid:
                    field = getattr(exc, "field", None)
                    why = f"{exc} (field: {field})" if field and f"field: {field}" not in str(exc) else str(exc)
                    self.loop.call_soon_threadsafe(self._resolve, rid, None, _Fail(why))
                continue
            except Exception:
                if self._stop.is_set():
                    return
                log.exception("transfer receiver failed")
                time.sleep(0.1)
                continue
            self.loop.call_soon_threadsafe(self._resolve, payload.request_id, payload, None)

    def _resolve(self, req_id: str, payload: Any, exc: BaseException | None) -> None:
        self._prefill_progress_at = self.loop.time()
        fut = self._waiting.get(req_id)
        if fut is None or fut.done():
            if payload is not None:
                payload.release()  # nobody waits for it any more (aborted or timed out)
            return
        if exc is not None:
            fut.set_exception(exc)
        else:
            fut.set_result(payload)

    def _fail_waiting(self, reason: str) -> None:
        for req_id, fut in list(self._waiting.items()):
            if not fut.done():
                fut.set_exception(_Fail(f"request {req_id}: {reason}"))

    # info -----------------------------------------------------------------------------------------
    async def server_info(self) -> dict[str, Any]:
        info = await super().server_info()
        info["registration"] = self.info.to_json() if self.info else None
        info["fingerprints"]["registration"] = self.info.fingerprint() if self.info else None
        info["pairing"] = None if self.pairing is None else {
            "endpoint": self.pairing.endpoint, "session_id": self.pairing.session_id,
            "server_epoch": self.pairing.server_epoch, "latency_s": self.pairing.latency_s,
            "prefill_fingerprint": self.pairing.prefill.fingerprint()}
        info["timing"].update({"handshakes": self.handshakes, "handshake_latency_s": self.handshake_latency_s,
                               "imported": self.imported, "failed": self.failed})
        return info


class _Fail(Exception):
    pass


def _fields(msg: PdTokens) -> dict[str, Any]:
    return {f: getattr(msg, f) for f in msg.__struct_fields__}


def _draft_runner(engine: Any) -> Any:
    drafter = getattr(getattr(engine, "decoder", None), "drafter", None)
    return getattr(drafter, "runner", None)


class _Admit:
    """Runs on the engine thread: install a transferred request in the engine (`Engine.add_imported`) as a
    running Sequence: target KV + state, prefill's first token and generator state, and the draft KV
    through the decoder's `import_draft` when prefill produced it (else the drafter rebuilds from tokens)."""

    def __init__(self, backend: DecodeBackend, prompt_ids: list[int], params: Any, payload: Any) -> None:
        self.backend = backend
        self.prompt_ids = prompt_ids
        self.params = params
        self.payload = payload

    def __call__(self, engine: Any) -> Any:
        import torch

        payload = self.payload
        extra = payload.extra
        length = int(payload.length)
        ids = self.prompt_ids or [engine.tokenizer.bos_token_id]
        if length != len(ids):
            raise RuntimeError(f"request {payload.request_id}: transfer length {length} != prompt length {len(ids)}")
        target = {k: v for k, v in payload.tensors.items() if not k.startswith("draft.")}
        draft = {k[len("draft."):]: v for k, v in payload.tensors.items() if k.startswith("draft.")}
        draft_length = int(extra.get("draft_length", 0) or 0)
        rng = extra.get("rng_state")
        state = torch.frombuffer(bytearray(rng), dtype=torch.uint8) if rng else None
        seq = engine.add_imported(ids, int(extra["first_token"]), target, self.params, generator_state=state,
                                  draft_tensors=draft if draft and draft_length else None, draft_length=draft_length)
        self.backend.imported += 1
        return seq
