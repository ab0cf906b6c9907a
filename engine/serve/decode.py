"""DecodeBackend: the decode role of a disaggregated deployment, speaking SGLang's disaggregation protocol.

Contract:
- Loads the Engine (target runner + the configured decoder: speculative, adaptive when configured), binds
  the transfer receiver, builds its RegistrationInfo from the live layouts (`endpoints["transfer"]`) and
  registers with the bootstrap endpoint of EVERY prefill instance of the deployment (one `PrefillLink`
  each). Until every link is paired, /health is 503 (`pairing`), so sglang-router never routes to it. A
  refusal prints the itemized diff as a table on stderr, logs it as one JSON line, and the process exits 3,
  never having answered 200.
- Each link pings its prefill every `HEARTBEAT_S` (keeping its session alive); a prefill that stops
  answering (or restarted) makes decode 503 again, fails the requests waiting on it at once, and the link
  re-registers until prefill is back.
- Per request (sglang-router's HTTP half, with `bootstrap_host/port/room`): claim the room on the named
  prefill's control socket (`PdClaim`), wait for the payload (the room table is pd/rooms.py's `DecodeRooms`;
  the transfer timeout measures liveness: from the claim until prefill holds it, from `started` until the
  payload, and while `queued` from prefill's last progress on any room; prefill itself fails a room whose HTTP
  half never comes, and that request answers 408: the client's to fix, the router posts to both sides), check
  it against the registration (pd/transfer.py), import it into the engine (target KV + state, and from its
  typed `PrefillResult` prefill's first token and generator state; the drafter rebuilds its own cache) and
  stream the tokens: plain or speculative decoding continues from exactly prefill's state. Every failure
  finishes the request with an error naming it; a client that goes away aborts the room on prefill; imported
  pages are freed by the engine.
- A request without `bootstrap_room`, or naming a prefill this decode is not paired with, is refused (400).
- With a shared secret every control message of a session carries its MAC (bootstrap.seal) and an
  unauthenticated one is dropped; decode exposes no control socket of its own (the router speaks HTTP).
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import json
import logging
import sys
import tempfile
import threading
import time
from collections.abc import AsyncIterator, Coroutine
from typing import TYPE_CHECKING, Any

import zmq
import zmq.asyncio

from specctl.engine.async_engine import RequestOutput
from specctl.engine.pd import wire
from specctl.engine.pd.bootstrap import HandshakeRejected, ping, register
from specctl.engine.pd.messages import PdAbort, PdClaim, PdDone, PdProgress, room_key
from specctl.engine.pd.registration import build_registration
from specctl.engine.pd.rooms import DecodeRooms, RoomFailure
from specctl.engine.pd.transfer import PayloadSpec, TransferError, TransferReceiver, TransferTimeout
from specctl.engine.serve.backend import (
    EngineBackend,
    RoleContext,
    draft_runner_of,
    secret_of,
    warn_unauthenticated,
)
from specctl.engine.serve.http import RequestError
from specctl.engine.serve.metrics import ServingMetrics
from specctl.engine.tokenizer import prompt_token_ids
from specctl.errors import RuntimeFailure
from specctl.schemas.role_config import connect_host

if TYPE_CHECKING:  # torch, and the PD modules this one imports lazily
    from specctl.engine.engine import Engine
    from specctl.engine.pd.bootstrap import HandshakeRejected, Pairing
    from specctl.engine.pd.messages import PrefillResult
    from specctl.engine.pd.registration import RegistrationInfo
    from specctl.engine.pd.transfer import Payload, TransferReceiver
    from specctl.engine.sampling_params import SamplingParams
    from specctl.engine.sequence import Sequence
    from specctl.engine.serve.openai_request import PdRoute
    from specctl.schemas.role_config import RoleConfig

log = logging.getLogger("specctl.decode")

HEARTBEAT_S = 1.0
MISSED_PINGS = 2  # consecutive unanswered pings before prefill counts as gone


class PrefillLink:
    """This decode's pairing with one prefill instance: its session, control socket and heartbeat."""

    def __init__(self, backend: DecodeBackend, role: RoleConfig) -> None:
        self.backend = backend
        if role.bootstrap_port is None:
            raise RuntimeFailure("a prefill role needs roles.prefill.bootstrap_port (decode registers there)")
        self.port = role.bootstrap_port
        self.endpoint = f"tcp://{connect_host(role)}:{self.port}"
        self.pairing: Pairing | None = None
        self.sock: zmq.asyncio.Socket | None = None
        self.ready = False

    @property
    def key(self) -> bytes | None:
        return None if self.pairing is None else self.pairing.key

    async def run(self) -> None:
        b = self.backend
        if b.ctx.faults.decode_link_error:
            raise RuntimeError(b.ctx.faults.decode_link_error)  # a test's stand-in for a bug (serve/faults.py)
        await self.register()
        missed = 0
        while not b.fatal.is_set():
            await asyncio.sleep(HEARTBEAT_S)
            pairing = self.pairing
            assert pairing is not None  # register() paired, or was refused and set `fatal`
            try:
                ok = await asyncio.to_thread(ping, pairing, timeout_s=1.0, retries=1)
                missed = 0
            except wire.WireError:
                missed += 1
                if missed < MISSED_PINGS:
                    continue
                ok = False
            if ok:
                continue
            reason = "prefill stopped answering" if missed else "prefill restarted or dropped the pairing"
            log.warning("%s (%s); re-registering", reason, self.endpoint)
            self.ready = False
            b.update_state()
            b.rooms.fail_link(self.port, f"{reason} before the request's KV arrived")
            missed = 0
            await self.register()

    async def register(self) -> None:
        """Register until accepted (prefill may not be up yet); a refusal is fatal."""
        b = self.backend
        secret = secret_of(b.ctx)
        info = b.info
        assert info is not None  # load() builds it before any link runs
        attempt = 0
        while True:
            attempt += 1
            b.ctx.state.set("pairing", f"registering with prefill at {self.endpoint} (attempt {attempt})")
            try:
                pairing = await asyncio.to_thread(register, self.endpoint, info, secret=secret,
                                                  timeout_s=min(5.0, b.ctx.timeout_s), retries=1)
            except HandshakeRejected as exc:
                b.refused(exc)
                return
            except wire.WireError as exc:
                log.info("prefill %s not answering yet: %s", self.endpoint, exc)
                await asyncio.sleep(0.5)
                continue
            self.paired(pairing)
            return

    def paired(self, pairing: Pairing) -> None:
        b = self.backend
        old = self.pairing
        self.pairing = pairing
        b.handshakes += 1
        b.handshake_latency_s = pairing.latency_s
        control = pairing.prefill.endpoints.get("control")
        if control is None:  # every prefill of this version advertises one (the handshake refuses others)
            raise RuntimeFailure(f"prefill {self.endpoint} paired but advertised no control endpoint",
                                 hint="run prefill and decode from the same specctl version")
        if old is None or old.prefill.endpoints.get("control") != control or self.sock is None:
            sock = b.zctx.socket(zmq.DEALER)
            wire.bound_socket(sock)  # progress and failures only: small
            sock.connect(control)
            self.sock = sock  # the previous socket's receive loop closes it once it sees it was replaced
            b.spawn(self.receive(sock), f"the receive loop for prefill {self.endpoint}")
        self.ready = True
        b.update_state()
        log.info("paired with prefill %s in %.3fs (fingerprint %s)", self.endpoint, pairing.latency_s,
                 pairing.prefill.fingerprint())

    async def send(self, msg: PdClaim | PdAbort) -> None:
        if self.sock is None:
            raise RoomFailure(f"decode is not paired with prefill {self.endpoint}")
        pairing = self.pairing
        assert pairing is not None  # the socket exists only once paired
        frames = pairing.control.seal([bytes(f) for f in wire.encode(msg)])
        await asyncio.wait_for(self.sock.send_multipart(frames), 5.0)

    async def receive(self, sock: zmq.asyncio.Socket) -> None:
        b = self.backend
        try:
            while sock is self.sock:
                try:
                    if not await sock.poll(300, zmq.POLLIN):  # type: ignore[call-arg]
                        continue
                    frames = [f.bytes for f in await sock.recv_multipart(copy=False)]
                except zmq.ZMQError:
                    return
                pairing = self.pairing
                body = pairing.control.open(frames) if pairing is not None else None
                if body is None:
                    refusal = pairing.control.last_refusal if pairing is not None else "auth"
                    b.rejections[refusal or "auth"] += 1
                    log.warning("refused a message from prefill %s that failed authentication or was replayed (%s)",
                                self.endpoint, refusal)
                    continue
                try:
                    msg = wire.decode(body, as_torch=False, expect=(PdProgress, PdDone)).msg
                    if not isinstance(msg, (PdProgress, PdDone)):
                        raise wire.WireError(f"unexpected {type(msg).__name__}")
                except wire.WireError as exc:
                    b.rejections["malformed"] += 1
                    log.warning("bad message from prefill %s: %s", self.endpoint, exc)
                    continue
                b.rooms.on_message(self.port, msg)
        finally:
            sock.close(linger=0)


class DecodeBackend(EngineBackend):
    front_counts_prompt_tokens = False  # prefill counts them once, where computed (record_prefill)
    supports_logprobs = False  # the first token is prefill's, whose log-prob does not travel (yet)

    def __init__(self, ctx: RoleContext) -> None:
        super().__init__(ctx)
        self.fatal = asyncio.Event()
        self.info: RegistrationInfo | None = None
        self.receiver: TransferReceiver | None = None
        self.zctx = zmq.asyncio.Context()
        self.links: dict[int, PrefillLink] = {}  # by bootstrap port
        self.rooms: DecodeRooms[Payload] = DecodeRooms(timeout_s=ctx.timeout_s, clock=time.monotonic,
                                                       release=lambda payload: payload.release())
        self.bg: list[asyncio.Task[None]] = []
        self._stop = threading.Event()
        self._recv_thread: threading.Thread | None = None
        self.handshakes = 0
        self.handshake_latency_s: float | None = None
        self.imported = 0
        self.failed = 0
        self.rejections: collections.Counter[str] = collections.Counter()  # refused control messages, by reason

    # lifecycle ------------------------------------------------------------------------------------
    async def load(self) -> None:
        await super().load()
        assert self.engine is not None  # super().load() built it
        self.loop = asyncio.get_running_loop()
        # Admission never exceeds the batch: a request whose KV arrived waits here for a running slot.
        self._batch_slots = asyncio.Semaphore(self.engine.config.max_batch_size)
        host = self.ctx.role.host or "127.0.0.1"
        warn_unauthenticated(self.ctx, host)
        transfer = self.ctx.transfer
        bind = f"tcp://{host}:0"
        if transfer.protocol == "ipc":
            bind = f"ipc://{tempfile.gettempdir()}/specctl-decode-{id(self):x}.ipc"
        # With a secret, a payload opens only with the key of the session that claimed its room.
        auth = self._key_for if secret_of(self.ctx) else None
        backend = transfer.backend
        runner = self.engine.runner
        draft = draft_runner_of(self.engine)
        speculative = self.engine.config.speculative

        def registration(endpoint: str) -> RegistrationInfo:
            return build_registration(
                "decode", runner.layout(), speculative=speculative,
                draft_layout=draft.layout() if draft is not None else None, transfer_backend=backend,
                endpoints={"transfer": endpoint}, facts=runner.facts,
                draft_facts=draft.facts if draft is not None else None,
            )  # fmt: skip

        # Every payload is checked against the registration (component names, order, dtypes, item sizes
        # and counts) before it is acknowledged; a mismatch fails that request naming the field. A frame larger
        # than a payload of max_context tokens needs disconnects its peer before it is buffered.
        spec = PayloadSpec.from_registration(registration(""))
        self.receiver = TransferReceiver(spec, bind=bind, timeout_s=self.ctx.timeout_s, auth=auth, backend=backend,
                                         max_message_bytes=spec.max_frame_bytes(self.max_context))
        self.info = registration(self.receiver.endpoint)
        self.ctx.state.extra.update({"fingerprint": self.info.fingerprint()})
        self._recv_thread = threading.Thread(target=self._receive_loop, name="specctl-transfer-recv", daemon=True)
        self._recv_thread.start()
        if self.ctx.deployment is None:
            raise RuntimeFailure("a decode role pairs with the prefills its deployment lists: it needs one")
        for pre in self.ctx.deployment.instances("prefill"):
            link = PrefillLink(self, pre)
            self.links[link.port] = link
        self.update_state()
        for link in self.links.values():
            self.spawn(link.run(), f"the link to prefill {link.endpoint}")

    def spawn(self, coro: Coroutine[Any, Any, None], what: str) -> None:
        """Run `coro` in the background for the life of the role. One that fails (a bug: the links handle
        every failure they expect) ends the role with exit 3 naming it, rather than dying unseen while
        /health says "pairing" for ever."""
        task = asyncio.create_task(coro)
        task.add_done_callback(lambda t: self._ended(t, what))
        self.bg.append(task)

    def _ended(self, task: asyncio.Task[None], what: str) -> None:
        if task.cancelled() or self._stop.is_set():
            return
        exc = task.exception()
        if exc is None:
            return
        reason = f"{what} failed: {type(exc).__name__}: {exc}"
        log.error("%s", reason, exc_info=exc)
        self.ctx.state.set("failed", reason)
        if self.ctx.state.fatal is None:
            self.ctx.state.fatal = RuntimeFailure(f"decode: {reason}",
                                                  hint="a specctl bug: the log above has the traceback; restart decode")
        self.fatal.set()

    async def close(self) -> None:
        self._stop.set()
        for t in self.bg:
            t.cancel()
        for t in self.bg:
            with contextlib.suppress(BaseException):
                await t
        if self._recv_thread is not None:
            await asyncio.to_thread(self._recv_thread.join, 2.0)
        if self.receiver is not None:
            self.receiver.close()
        for link in self.links.values():
            if link.sock is not None:
                link.sock.close(linger=0)
        self.zctx.destroy(linger=0)
        await super().close()

    def _key_for(self, req_id: str) -> bytes | None:
        """Transfer thread: the session key of the link that claimed `req_id`, or None (nobody did). A room
        that just ended (timed out, aborted) keeps its key a while (`DecodeRooms.recent_key`), so a late payload
        is still authenticated and acknowledged (and dropped) instead of leaving prefill's sender waiting."""
        port = self.rooms.link_of(req_id)
        link = self.links.get(port) if port is not None else None
        return link.key if link is not None else self.rooms.recent_key(req_id)

    def update_state(self) -> None:
        if self.fatal.is_set():
            return
        waiting = [link.endpoint for link in self.links.values() if not link.ready]
        self.ctx.state.extra["paired_with"] = [link.endpoint for link in self.links.values() if link.ready]
        if waiting:
            self.ctx.state.set("pairing", f"waiting for the handshake with prefill {', '.join(waiting)}")
        else:
            self.ctx.state.set("ready", ready=True)

    def refused(self, exc: HandshakeRejected) -> None:
        self.ctx.state.set("refused", exc.reason)
        print(f"decode: {exc}", file=sys.stderr, flush=True)
        log.error("handshake refused: %s", json.dumps({"event": "handshake_refused", **exc.to_json()},
                                                      default=str))
        self.ctx.state.fatal = RuntimeFailure(
            f"decode refused by prefill: {exc.reason}",
            hint="the diff above lists every field that differs; fix them and restart decode")
        self.fatal.set()

    # Backend protocol -----------------------------------------------------------------------------
    def check_params(self, params: SamplingParams, route: PdRoute | None) -> None:
        if route is None:
            raise RequestError("this is a decode server: it serves disaggregated requests from sglang-router "
                               "(bootstrap_host, bootstrap_port, bootstrap_room); send requests to the router",
                               param="bootstrap_room")
        if route.port not in self.links:
            raise RequestError(f"bootstrap_port {route.port} is not a prefill this decode pairs with "
                               f"(bootstrap ports: {sorted(self.links)})", param="bootstrap_port")
        if room_key(route.room) in self.rooms:  # generate() would fail it as a 503
            raise RequestError(f"bootstrap_room {route.room} is already being served by this decode; "
                               "each request needs a room of its own", param="bootstrap_room", status=409,
                               code="room_in_use")

    def load_info(self) -> dict[str, int]:
        return {"num_reqs": len(self.rooms) + (self.aengine.num_live if self.aengine else 0)}

    async def generate(self, prompt_ids: list[int], params: SamplingParams, *, route: PdRoute | None = None,
                       stream: bool = True) -> AsyncIterator[RequestOutput]:
        assert route is not None  # check_params refused a request without one
        req_id = room_key(route.room)
        link = self.links[route.port]
        t0 = time.perf_counter()
        timings: dict[str, float] = {}
        payload: Payload | None = None
        claimed = got_payload = finished = slot = opened = False
        try:
            if not link.ready or link.pairing is None:
                raise RoomFailure(f"decode is not paired with prefill {link.endpoint} ({self.ctx.state.detail})")
            self.rooms.open(req_id, link.port)
            opened = True
            await link.send(PdClaim(req_id=req_id, prompt_ids=list(prompt_ids), pairing_id=link.pairing.session_id))
            claimed = True
            payload = await self.rooms.wait(req_id)
            got_payload = True
            received = time.perf_counter()
            result = payload.result
            if result is None:
                raise RoomFailure(f"{req_id}: prefill's payload carries no PrefillResult")
            timings["prefill_wait_s"] = received - t0
            timings["prefill_s"] = result.compute_s  # the step that prefilled it on prefill
            timings["prefill_queue_s"] = result.queue_s  # arrival on prefill -> its prefill step
            timings["transfer_s"] = max(0.0, time.time() - result.sent_at)
            self.ctx.metrics.transfer_bytes.inc(payload.nbytes, direction="received")
            self.ctx.metrics.transfer_seconds.observe(timings["transfer_s"])
            await self._batch_slots.acquire()
            slot = True
            admit = _Admit(self, list(prompt_ids), params, payload, result)
            assert self.aengine is not None
            first_at: float | None = None
            async for item in self.aengine.generate(prompt_ids, params, admit=admit, coalesce=not stream):
                if first_at is None:
                    first_at = time.perf_counter()
                    timings["decode_queue_s"] = first_at - received
                if item.finished:
                    finished = True
                    item.timings = {**timings, **item.timings, "decode_total_s": time.perf_counter() - t0}
                    if item.finish_reason == "error":
                        self.failed += 1
                yield item
                if item.finished:
                    return
        except RoomFailure as exc:
            self.failed += 1
            finished = True
            yield RequestOutput([], True, "error", str(exc), error_status=exc.status)
        finally:
            if opened:
                self.rooms.close(req_id, link.key)
            if slot:
                self._batch_slots.release()
            if payload is not None:
                payload.release()
            if claimed and not got_payload and not finished and link.pairing is not None:
                # Aborted while prefill works on it: let prefill drop the room now.
                with contextlib.suppress(Exception):
                    await link.send(PdAbort(req_id=req_id, pairing_id=link.pairing.session_id))

    def _receive_loop(self) -> None:
        """Transfer receiver thread: hand each payload to the request waiting for it."""

        receiver = self.receiver
        assert receiver is not None  # load() binds it before starting this thread
        while not self._stop.is_set():
            try:
                payload = receiver.recv(timeout_s=0.25)
            except TransferTimeout:
                continue
            except TransferError as exc:
                rid = getattr(exc, "request_id", None)
                log.warning("transfer rejected: %s", exc)
                if rid:
                    field = getattr(exc, "field", None)
                    why = f"{exc} (field: {field})" if field and f"field: {field}" not in str(exc) else str(exc)
                    self.loop.call_soon_threadsafe(self.rooms.resolve, rid, None, RoomFailure(why))
                continue
            except Exception:
                if self._stop.is_set():
                    return
                log.exception("transfer receiver failed")
                time.sleep(0.1)
                continue
            self.loop.call_soon_threadsafe(self.rooms.resolve, payload.request_id, payload, None)

    # info -----------------------------------------------------------------------------------------
    def pd_rejections(self) -> dict[str, int]:
        """Every PD-plane refusal of this decode by reason (payloads, control messages from prefill)."""
        out = dict(self.rejections)
        if self.receiver is not None:
            for reason, n in self.receiver.rejections.items():
                out[f"transfer_{reason}"] = n
        return out

    async def refresh_metrics(self, metrics: ServingMetrics) -> None:
        await super().refresh_metrics(metrics)
        metrics.pd_transfers_in_flight.set(len(self.rooms))
        for reason, n in self.pd_rejections().items():
            metrics.pd_rejected.mirror(n, reason=reason)

    async def server_info(self) -> dict[str, Any]:
        info = await super().server_info()
        # The fingerprint only: the registration itself is what a stranger would need to claim to be a peer.
        info["fingerprints"]["registration"] = self.info.fingerprint() if self.info else None
        info["pairing"] = [{"endpoint": link.endpoint, "ready": link.ready,
                            "prefill_fingerprint": link.pairing.prefill.fingerprint() if link.pairing else None}
                           for link in self.links.values()]
        info["rejected_by_reason"] = self.pd_rejections()
        info["timing"].update({"handshakes": self.handshakes, "handshake_latency_s": self.handshake_latency_s,
                               "imported": self.imported, "failed": self.failed})
        return info


class _Admit:
    """Runs on the engine thread: install a transferred request in the engine (`Engine.add_imported`) as a
    running Sequence with prefill's first token and generator state (the drafter rebuilds its own cache)."""

    def __init__(self, backend: DecodeBackend, prompt_ids: list[int], params: SamplingParams, payload: Payload,
                 result: PrefillResult) -> None:
        self.backend = backend
        self.prompt_ids = prompt_ids
        self.params = params
        self.payload = payload
        self.result = result

    def __call__(self, engine: Engine) -> Sequence:
        payload, result = self.payload, self.result
        length = int(payload.length)
        ids = prompt_token_ids(engine.tokenizer, self.prompt_ids)  # prefill's Engine.add_request applied it too
        if length != len(ids):
            raise RuntimeError(f"{payload.request_id}: transfer length {length} != prompt length {len(ids)}")
        target = {k: v for k, v in payload.tensors.items() if not k.startswith("draft.")}
        draft = {k[len("draft."):]: v for k, v in payload.tensors.items() if k.startswith("draft.")}
        draft_length = result.draft_length
        seq = engine.add_imported(ids, result.first_token, target, self.params, generator_state=result.rng_state,
                                  draft_tensors=draft if draft and draft_length else None, draft_length=draft_length)
        self.backend.imported += 1
        return seq
