"""PrefillBackend: the prefill role of a disaggregated deployment, speaking SGLang's disaggregation protocol.

Contract:
- Loads an Engine like the colocated role (target, and the draft's runner when decode speculates with a
  draft: its layout is part of the registration; prefill never runs it, decode's drafter builds its own
  cache from the prompt, so the draft components travel empty with `draft_length: 0`), builds its
  RegistrationInfo from the live layouts and serves the bootstrap endpoint on `bootstrap_port` (decodes
  register there; every decode is its own session, pd/bootstrap.py), plus a ZMQ control socket
  (`endpoints["control"]`) where paired decodes claim rooms (`PdClaim`, pd/messages.py).
- sglang-router sends each request to prefill and to decode at once with `bootstrap_room`. Prefill's HTTP
  half is admitted into the Engine with `export_after_prefill`: batched and chunked by the same Scheduler as
  every other request; once the prompt is cached the first token is sampled, the caches are exported and
  the pages freed. Then the room waits for decode's claim (it usually came first), the payload goes to that
  session's decode over the transfer backend (zmq or shm; decode verifies it against the registration and
  acknowledges), and the HTTP half answers with the first token.
- A room whose other half never comes errors within `transfer.timeout_s`: an HTTP half without a claim
  answers a 408, a claim without an HTTP half gets `PdDone` with status 408 (the room failed; a direct client
  that posts to one side only caused it, so neither side answers a 5xx); a failed transfer errors both (503).
  Nothing is left behind: pages are freed at export, exported tensors dropped with the room.
- A request without `bootstrap_room` is refused (400): prefill serves the router, not clients.
- With a shared secret every control message must carry its session's MAC (bootstrap.seal); one that does
  not is refused and counted (`auth_failures`), never acted on. Without one, the PD plane binds loopback
  and logs a warning that pairing is unauthenticated.
- Test-only faults come from the role context's `FaultPlan` (serve/faults.py: a file the test names with
  the hidden `serve --fault-plan`, read once at start-up, never per request): hold each payload before
  sending it, or reverse the components of a marked prompt.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import dataclasses
import functools
import logging
import time
import weakref
from collections.abc import AsyncIterator
from typing import TYPE_CHECKING, Any, cast

import zmq
import zmq.asyncio

from specctl.engine.async_engine import RequestOutput
from specctl.engine.pd import wire
from specctl.engine.pd.bootstrap import Peer
from specctl.engine.pd.messages import PdAbort, PdClaim, PdDone, PdProgress, room_key
from specctl.engine.pd.outbox import TransferOutbox
from specctl.engine.serve.backend import (
    BOTH_HALVES,
    EngineBackend,
    RoleContext,
    RoomFailure,
    draft_runner_of,
    secret_of,
    warn_unauthenticated,
)
from specctl.engine.serve.metrics import ServingMetrics

if TYPE_CHECKING:  # torch, and the PD modules this one imports lazily
    import torch

    from specctl.engine.engine import Engine
    from specctl.engine.pd.bootstrap import BootstrapServer
    from specctl.engine.pd.registration import RegistrationInfo
    from specctl.engine.pd.transfer import TransferResult
    from specctl.engine.sampling_params import SamplingParams
    from specctl.engine.sequence import Sequence
    from specctl.engine.serve.openai_request import PdRoute

log = logging.getLogger("specctl.prefill")

# A session not heard from this long (decode pings every second) fails the rooms it holds at once.
STALE_SESSION_S = 5.0
MAX_UNMATCHED_CLAIMS = 256  # per session: claims waiting for an HTTP half (each expires in transfer.timeout_s)
MAX_WAITING_CLAIMS = 1024  # all sessions together


def _sent(fut: asyncio.Future[Any], req_id: str) -> None:
    if not fut.cancelled() and fut.exception() is not None:
        log.debug("could not answer decode for %s: %s", req_id, fut.exception())  # decode is gone


def claim_bytes_bound(max_context: int) -> int:
    """The largest control message prefill accepts: a claim of `max_context` prompt ids plus its parameters."""
    return 9 * int(max_context) + wire.MAX_CONTROL_BYTES


@dataclasses.dataclass(eq=False)
class _Room:
    """Both halves of one bootstrap room as prefill sees them."""

    key: str
    created: float = dataclasses.field(default_factory=time.monotonic)
    http: asyncio.Event = dataclasses.field(default_factory=asyncio.Event)
    claimed: asyncio.Event = dataclasses.field(default_factory=asyncio.Event)
    prompt_ids: list[int] | None = None
    claim: PdClaim | None = None
    identity: bytes = b""
    peer: Peer | None = None
    aborted: str | None = None


class PrefillBackend(EngineBackend):
    front_counts_prompt_tokens = False  # prefill counts them once, where computed (record_prefill)
    # The first token's log-prob would have to travel to decode, which answers the client: refused by name.
    supports_logprobs = False

    def __init__(self, ctx: RoleContext) -> None:
        super().__init__(ctx)
        self.bootstrap: BootstrapServer | None = None
        self.info: RegistrationInfo | None = None
        self.faults = ctx.faults
        self._outbox: TransferOutbox | None = None  # per-session concurrent transfers (load() builds it)
        self._zctx = zmq.asyncio.Context()
        self._sock: zmq.asyncio.Socket | None = None
        self._rooms: dict[str, _Room] = {}
        self._pending: set[Sequence] = set()  # admitted, first token not yet sampled (engine thread only)
        # (start, seconds) of the step that sampled a room's first token, set on the engine thread; weak, so an
        # entry lives as long as its Sequence
        self._prefill_steps: weakref.WeakKeyDictionary[Sequence, tuple[float, float]] = weakref.WeakKeyDictionary()
        self._bg: list[asyncio.Task[None]] = []
        self.completed = 0
        self.failed = 0
        self.auth_failures = 0
        self.rejections: collections.Counter[str] = collections.Counter()  # refused control messages, by reason
        self.transfer_s = 0.0
        self.compute_s = 0.0

    # lifecycle ------------------------------------------------------------------------------------
    async def load(self) -> None:
        from specctl.engine.pd.bootstrap import BootstrapServer
        from specctl.engine.pd.registration import build_registration
        from specctl.engine.pd.transfer import PayloadSpec

        await super().load()
        assert self.aengine is not None and self.engine is not None
        self.aengine.on_step = self._on_step
        engine = self.engine
        host = self.ctx.role.host or "127.0.0.1"
        warn_unauthenticated(self.ctx, host)
        self._sock = self._zctx.socket(zmq.ROUTER)
        # A claim carries a prompt of at most max_context ids (msgpack: <= 9 bytes each) and its parameters.
        wire.bound_socket(self._sock, claim_bytes_bound(self.max_context))
        self._sock.setsockopt(zmq.ROUTER_MANDATORY, 1)
        self._sock.bind(f"tcp://{host}:0")
        control = self._sock.getsockopt_string(zmq.LAST_ENDPOINT)
        draft = draft_runner_of(engine)
        self.info = build_registration(
            "prefill", engine.runner.layout(), speculative=engine.config.speculative,
            draft_layout=draft.layout() if draft is not None else None,
            transfer_backend=self.ctx.transfer.backend, endpoints={"control": control},
            facts=engine.runner.facts, draft_facts=draft.facts if draft is not None else None,
        )  # fmt: skip
        # Components go out in the order the registration fixes; decode checks each payload against it.
        self._component_order = PayloadSpec.from_registration(self.info).names
        bport = self.ctx.role.bootstrap_port
        if bport is None:
            from specctl.errors import UsageError

            raise UsageError("the prefill role needs roles.prefill.bootstrap_port (decode registers there)")
        self.bootstrap = BootstrapServer(self.info, host=host, port=int(bport), secret=secret_of(self.ctx),
                                         on_pair=self._on_pair, on_unpair=self._on_unpair).start()
        self._outbox = TransferOutbox(backend=self.ctx.transfer.backend,
                                      timeout_s=self.ctx.timeout_s, liveness=self._session_age,
                                      stale_after_s=min(STALE_SESSION_S, self.bootstrap.peer_ttl_s))
        self._bg.append(asyncio.create_task(self._control_loop()))
        self.ctx.state.extra.update({"fingerprint": self.info.fingerprint(), "paired": 0})
        self.ctx.state.set("ready", ready=True)
        log.info("prefill ready: bootstrap %s, fingerprint %s", self.bootstrap.endpoint, self.info.fingerprint())

    def _on_pair(self, peer: Peer) -> None:
        if not peer.info.endpoints.get("transfer"):
            raise ValueError("decode advertised no transfer endpoint")
        self.ctx.state.extra["paired"] = len(self.bootstrap.peers) + 1 if self.bootstrap else 1
        log.info("paired with a decode (session %d)", peer.generation)

    def _on_unpair(self, peer: Peer) -> None:
        log.info("session %d expired (its decode stopped pinging)", peer.generation)
        if self._outbox is not None:  # its rooms fail now, not one transfer timeout each
            self._outbox.fail_session(peer.session_id, "decode's session expired (its decode stopped pinging)")

    def _session_age(self, session_id: str) -> float | None:
        """Seconds since `session_id`'s decode was last heard from; None once the session is gone."""
        peer = self.bootstrap.peer_for(session_id) if self.bootstrap is not None else None
        return None if peer is None else time.monotonic() - peer.last_seen

    async def close(self) -> None:
        for t in self._bg:
            t.cancel()
        for t in self._bg:
            with contextlib.suppress(BaseException):
                await t
        if self.bootstrap is not None:
            await asyncio.to_thread(self.bootstrap.stop)
        if self._outbox is not None:
            await asyncio.to_thread(self._outbox.close)
        if self._sock is not None:
            self._sock.close(linger=0)
        self._zctx.destroy(linger=0)
        await super().close()

    # Backend protocol -----------------------------------------------------------------------------
    def check_params(self, params: SamplingParams, route: PdRoute | None) -> None:
        from specctl.engine.serve.http import RequestError

        if route is None:
            raise RequestError("this is a prefill server: it serves disaggregated requests from sglang-router "
                               "(bootstrap_host, bootstrap_port, bootstrap_room); send requests to the router",
                               param="bootstrap_room")
        room = self._rooms.get(room_key(route.room))
        if room is not None and room.prompt_ids is not None:  # generate() would fail it as a 503
            raise RequestError(f"bootstrap_room {route.room} is already being served by this prefill; "
                               "each request needs a room of its own", param="bootstrap_room", status=409,
                               code="room_in_use")

    def health(self) -> tuple[bool, dict[str, Any]]:
        if self.bootstrap is not None:
            self.ctx.state.extra["paired"] = len(self.bootstrap.peers)
        return super().health()

    def load_info(self) -> dict[str, int]:
        return {"num_reqs": len(self._rooms)}

    async def generate(self, prompt_ids: list[int], params: SamplingParams, *, route: PdRoute | None = None,
                       stream: bool = True) -> AsyncIterator[RequestOutput]:
        """The HTTP half of one room: prefill it in the Engine, wait for its claim, send, answer token 1
        (one token either way, so `stream` changes nothing here)."""
        assert route is not None  # check_params refused a request without one
        key = room_key(route.room)
        room = self._rooms.setdefault(key, _Room(key))
        if room.prompt_ids is not None:
            yield RequestOutput([], True, "error", f"{key} was already sent to this prefill")
            return
        room.prompt_ids = list(prompt_ids)
        room.http.set()
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.ctx.timeout_s
        error: str | None = None
        error_status: int | None = None
        try:
            if room.claim is not None:
                await self._reply(room, PdProgress(req_id=key, stage="started"))
            seq, out = await self._prefill(list(prompt_ids), params)
            if out.finish_reason != "prefilled" or seq is None or seq.exported is None:
                raise RoomFailure(out.error or f"prefill did not complete ({out.finish_reason})")
            self.compute_s += float(out.timings.get("ttft_s", 0.0))
            left = deadline - loop.time()
            if not room.claimed.is_set():
                try:
                    await asyncio.wait_for(room.claimed.wait(), max(0.0, left))
                except asyncio.TimeoutError:
                    raise RoomFailure(f"no decode claimed {key} within {self.ctx.timeout_s:g}s (transfer.timeout_s): "
                                      f"the router's request never reached a paired decode; {BOTH_HALVES}",
                                      status=408) from None
            if room.aborted:
                raise RoomFailure(f"{key}: decode aborted it ({room.aborted})")
            claim = room.claim
            assert claim is not None and room.peer is not None
            if list(claim.prompt_ids) != list(prompt_ids):  # the sender's fault: a 4xx on both halves
                raise RoomFailure(f"{key}: decode and prefill received different prompts ({len(claim.prompt_ids)} vs "
                                  f"{len(prompt_ids)} tokens); the router must send the same request to both",
                                  status=400)
            first = int(seq.output_ids[0])
            sent = await self._send(room, seq, first, out, self._empty_draft())
            self.completed += 1
            self.transfer_s += sent.seconds
            self.ctx.metrics.transfer_bytes.inc(sent.nbytes, direction="sent")
            self.ctx.metrics.transfer_seconds.observe(sent.seconds)
            self.ctx.metrics.record_prefill(prompt_tokens=len(prompt_ids),
                                            compute_s=float(out.timings.get("compute_s", 0.0)))
            yield RequestOutput([first], True, "length", completion_tokens=1, timings=dict(out.timings))
        except RoomFailure as exc:
            error, error_status = str(exc), exc.status
        except asyncio.CancelledError:
            error = "aborted"
            raise
        except Exception as exc:  # transfer error or timeout: fail this room only
            error = f"{type(exc).__name__}: {exc}"
            self.ctx.metrics.transfer_failures.inc(reason=type(exc).__name__)
        finally:
            self._rooms.pop(key, None)
            if error is not None:
                self.failed += 1
                log.warning("%s failed on prefill: %s", key, error)
                if room.claim is not None and not room.aborted:  # decode answers with the same status
                    await self._reply(room, PdDone(req_id=key, error=error, status=error_status or 0))
        if error is not None and error != "aborted":
            yield RequestOutput([], True, "error", error, error_status=error_status)

    def _on_step(self, engine: Engine) -> None:
        """Engine thread, after each step: the step that sampled a room's first token splits the room's time on
        prefill into queueing (its arrival -> that step's start) and compute (that step: its batch's forward
        and export). A request that finished without one (its client went away mid-prefill: aborted) leaves
        too; `_prefill`, cancelled, never got to discard it."""
        if not self._pending or self.aengine is None or not self.aengine.step_times:
            return
        duration = self.aengine.step_times[-1]
        start = time.monotonic() - duration
        for seq in [s for s in self._pending if s.first_token_time is not None or s.is_finished]:
            if seq.first_token_time is not None:
                self._prefill_steps[seq] = (start, duration)
            self._pending.discard(seq)

    async def _prefill(self, prompt_ids: list[int], params: SamplingParams) -> tuple[Sequence | None, RequestOutput]:
        # Prefill samples token 1 only; decode applies the request's stop conditions to it (add_imported),
        # so here nothing may finish the request before its caches are exported.
        sp = dataclasses.replace(params, max_tokens=2, stop=(), ignore_eos=True)
        holder: dict[str, Sequence | None] = {}

        def admit(engine: Engine) -> int:
            rid = int(engine.add_request(prompt_ids, sp, export_after_prefill=True))
            seq = holder["seq"] = engine._seqs.get(rid)  # the Sequence carries the export and the generator
            if seq is not None:
                self._pending.add(seq)
            return rid

        assert self.aengine is not None
        final = RequestOutput([], True, "error", "prefill produced no result")
        async for item in self.aengine.generate(prompt_ids, sp, admit=admit):
            if item.finished:
                final = item
        seq = holder.get("seq")
        if seq is not None:
            await self.aengine.call(lambda eng: self._pending.discard(seq))
            step = self._prefill_steps.get(seq)
            if step is not None:
                final.timings["queue_s"] = max(0.0, float(step[0]) - seq.arrival_time)
                final.timings["compute_s"] = float(step[1])
        return seq, final

    def _empty_draft(self) -> dict[str, torch.Tensor]:
        """The draft's components for zero cached tokens. Prefill does not run the draft model: decode's
        drafter builds its cache from the prompt at its first step, as a colocated engine does after its first
        token, so the draft's prefill stays out of TTFT. The components are still sent (the registration
        fixes them) and `draft_length: 0` tells decode they hold nothing."""
        import torch

        runner = draft_runner_of(self.engine)
        if runner is None:
            return {}
        dtype = getattr(torch, runner.layout().dtype)
        out = {}
        for name, shape in runner.cache.export_shapes(0).items():
            out[f"draft.{name}"] = torch.zeros(shape, dtype=torch.float32 if name == "mamba_ssm" else dtype)
        return out

    async def _send(self, room: _Room, seq: Sequence, first: int, out: RequestOutput, draft: dict[str, torch.Tensor]
                    ) -> TransferResult:
        import torch

        assert seq.exported is not None  # generate() checked it; only this method clears it
        exported: dict[str, Any] = {**seq.exported, **draft}
        tensors = {n: exported[n] for n in self._component_order if n in exported}
        tensors.update({n: t for n, t in exported.items() if n not in tensors})
        marker = self.faults.prefill_corrupt_marker
        if marker and marker in self.decode(list(seq.prompt_ids)):
            tensors = dict(reversed(list(tensors.items())))
        ttft = float(out.timings.get("ttft_s", 0.0))
        extra: dict[str, Any] = {"first_token": first, "prefill_s": float(out.timings.get("compute_s", ttft)),
                                 "queue_s": float(out.timings.get("queue_s", 0.0)),
                                 "draft_length": 0}
        if seq.generator is not None:
            extra["rng_state"] = bytes(seq.generator.get_state().to(torch.uint8).numpy().tobytes())
        seq.exported = None
        if self.faults.prefill_hold_s > 0:
            await asyncio.sleep(self.faults.prefill_hold_s)
        if room.aborted:
            raise RoomFailure(f"{room.key}: decode aborted it ({room.aborted})")
        assert room.peer is not None
        endpoint = str(room.peer.info.endpoints["transfer"])
        extra["sent_at"] = time.time()
        assert self._outbox is not None  # load() built it
        # The room's own lane: a slow or stopped decode holds up only its own session's rooms.
        fut = self._outbox.submit(room.peer.session_id, endpoint, room.peer.transfer, room.key, tensors,
                                  length=len(seq.prompt_ids), extra=extra)
        return await asyncio.wrap_future(fut)

    # control socket -------------------------------------------------------------------------------
    async def _control_loop(self) -> None:
        sock = self._sock
        assert sock is not None
        while True:
            if not await sock.poll(500, zmq.POLLIN):  # type: ignore[call-arg]
                continue
            frames = [f.bytes for f in await sock.recv_multipart(copy=False)]
            try:
                self._on_control(frames[0], frames[1:])
            except Exception:  # one bad message never stops the loop
                log.exception("control message failed")

    def _on_control(self, identity: bytes, frames: list[bytes]) -> None:
        try:
            # Parse first to learn the session, then check the MAC with that session's key (msgspec decoding
            # is safe on untrusted bytes; nothing is acted on before the MAC is checked).
            msg = wire.decode(frames[:1], as_torch=False, expect=(PdClaim, PdAbort)).msg
            if not isinstance(msg, (PdClaim, PdAbort)):
                raise wire.WireError(f"unexpected {type(msg).__name__}")
        except wire.WireError as exc:
            self.auth_failures += 1
            self.rejections["malformed"] += 1
            log.warning("refused a malformed control message: %s", exc)
            return
        peer = self.bootstrap.peer_for(msg.pairing_id) if self.bootstrap is not None else None
        if peer is None:
            if isinstance(msg, PdClaim) and self.bootstrap is not None and not self.bootstrap.auth_required:
                self._reply_to(identity, None, PdDone(req_id=msg.req_id, error=(
                    "prefill is not paired with this decode (it restarted, or the session expired); re-register")))
            else:
                self.auth_failures += 1
                self.rejections["session"] += 1
                log.warning("refused a control message for an unknown session")
            return
        if peer.control.open(frames) is None:  # forged, or a replay of a message already seen
            self.auth_failures += 1
            self.rejections[peer.control.last_refusal or "auth"] += 1
            log.warning("refused a control message that failed authentication or was replayed (%s, session %d)",
                        peer.control.last_refusal, peer.generation)
            return
        peer.last_seen = time.monotonic()
        room = self._rooms.get(msg.req_id)
        if isinstance(msg, PdAbort):
            if room is not None and room.peer is not None and room.peer.session_id == peer.session_id:
                room.aborted = msg.reason
                room.claimed.set()
            return
        if room is not None and room.claim is not None:
            self._reply_to(identity, peer, PdDone(req_id=msg.req_id,
                                                  error=f"{msg.req_id} is already claimed"))
            return
        if len(msg.prompt_ids) > self.max_context:
            self.rejections["prompt_size"] += 1
            self._reply_to(identity, peer, PdDone(req_id=msg.req_id, status=413, error=(
                f"the claim's prompt has {len(msg.prompt_ids)} tokens, over this prefill's {self.max_context}")))
            return
        if room is None:
            # Claims whose HTTP half has not come are bounded per session and in all: a peer cannot pile them up.
            unmatched = [r for r in self._rooms.values() if r.peer is not None and not r.http.is_set()]
            waiting = sum(1 for r in unmatched if r.peer is not None and r.peer.session_id == peer.session_id)
            if waiting >= MAX_UNMATCHED_CLAIMS or len(unmatched) >= MAX_WAITING_CLAIMS:
                self.rejections["claims"] += 1
                self._reply_to(identity, peer, PdDone(req_id=msg.req_id, error=(
                    f"{waiting} claims of this session ({len(unmatched)} in all) wait for rooms prefill never "
                    "received; refused")))
                return
            room = self._rooms[msg.req_id] = _Room(msg.req_id)
            self._bg.append(asyncio.create_task(self._expire_unsent(room)))
        room.claim, room.identity, room.peer = msg, identity, peer
        room.claimed.set()
        self._reply_to(identity, peer, PdProgress(req_id=msg.req_id, stage="queued"))
        if room.http.is_set():
            self._reply_to(identity, peer, PdProgress(req_id=msg.req_id, stage="started"))

    async def _expire_unsent(self, room: _Room) -> None:
        """A claim whose HTTP half never reaches this prefill fails within the transfer timeout."""
        try:
            await asyncio.wait_for(room.http.wait(), self.ctx.timeout_s)
        except asyncio.TimeoutError:
            if self._rooms.get(room.key) is room:
                del self._rooms[room.key]
                self.failed += 1
                log.warning("%s: the router's request never reached this prefill", room.key)
                await self._reply(room, PdDone(req_id=room.key, status=408, error=(
                    f"the router's request for {room.key} never reached prefill within {self.ctx.timeout_s:g}s "
                    f"(transfer.timeout_s); {BOTH_HALVES}")))
        finally:
            task = asyncio.current_task()
            if task in self._bg:
                self._bg.remove(task)

    def _reply_to(self, identity: bytes, peer: Peer | None, msg: PdProgress | PdDone) -> None:
        if self._sock is None:
            return
        frames = [bytes(f) for f in wire.encode(msg)]
        if peer is not None:
            frames = peer.control.seal(frames)
        try:
            sent = self._sock.send_multipart([identity, *frames], flags=zmq.NOBLOCK)
        except zmq.ZMQError as exc:
            log.debug("could not answer decode for %s: %s", msg.req_id, exc)  # decode is gone
            return
        # zmq.asyncio reports a failed non-blocking send (EHOSTUNREACH: decode is gone) on the returned future;
        # retrieve it here, or every reply to a vanished peer logs "Future exception was never retrieved".
        cast("asyncio.Future[Any]", sent).add_done_callback(functools.partial(_sent, req_id=msg.req_id))

    async def _reply(self, room: _Room, msg: PdProgress | PdDone) -> None:
        if room.claim is not None:
            self._reply_to(room.identity, room.peer, msg)

    # info -----------------------------------------------------------------------------------------
    async def server_info(self) -> dict[str, Any]:
        info = await super().server_info()
        # The fingerprint only: the registration itself is what a stranger would need to claim to be a peer.
        info["fingerprints"]["registration"] = self.info.fingerprint() if self.info else None
        info["pool"] = await self._pool()
        info["in_flight"] = len(self._rooms)
        stats = vars(self.bootstrap.stats) if self.bootstrap else {}
        # Endpoints are no secret: claiming a room needs a session (ids never leave the handshake) and, with a
        # shared secret, that session's key.
        info["bootstrap"] = {**stats, "sessions": len(self.bootstrap.peers) if self.bootstrap else 0,
                             "rejected_by_reason": self.pd_rejections(),
                             "auth_failures": self.auth_failures, "authenticated": bool(secret_of(self.ctx)),
                             "endpoint": self.bootstrap.endpoint if self.bootstrap else None,
                             "control": self.info.endpoints.get("control") if self.info else None}
        info["timing"].update({"completed": self.completed, "failed": self.failed,
                               "mean_compute_s": self.compute_s / self.completed if self.completed else None,
                               "mean_transfer_s": self.transfer_s / self.completed if self.completed else None})
        return info

    async def _pool(self) -> dict[str, int]:
        if self.aengine is None:
            return {}
        return dict(await self.aengine.call(lambda eng: {"free_pages": int(eng.runner.num_free_pages),
                                                         "total_pages": int(eng.runner.num_total_pages)}))

    async def refresh_metrics(self, metrics: ServingMetrics) -> None:
        await super().refresh_metrics(metrics)
        metrics.pd_sessions.set(len(self.bootstrap.peers) if self.bootstrap is not None else 0)
        metrics.pd_claims_waiting.set(sum(1 for r in self._rooms.values() if r.claim is not None
                                          and not r.http.is_set()))
        metrics.pd_transfers_in_flight.set(sum(self._outbox.in_flight().values()) if self._outbox else 0)
        for reason, n in self.pd_rejections().items():
            metrics.pd_rejected.mirror(n, reason=reason)

    def pd_rejections(self) -> dict[str, int]:
        """Every PD-plane refusal of this prefill by reason: control messages and the bootstrap's refusals."""
        out = dict(self.rejections)
        if self.bootstrap is not None:
            for kind, n in self.bootstrap.stats.rejected_by.items():
                out[f"bootstrap_{kind}"] = n
        return out


