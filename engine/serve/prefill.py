"""PrefillBackend: the prefill role of a disaggregated deployment, speaking SGLang's disaggregation protocol.

Contract:
- Loads an Engine like the colocated role (target, and the draft's runner when decode speculates with a
  draft: its layout is part of the registration; prefill never runs it, decode's drafter builds its own
  cache from the prompt, so the draft components travel empty with `draft_length: 0`), builds its
  RegistrationInfo from the live layouts and serves the bootstrap endpoint on `bootstrap_port` (decodes
  register there; every decode is its own session, pd/bootstrap.py), plus a ZMQ control socket
  (`endpoints["control"]`) where paired decodes claim rooms (`PdClaim`, pd/messages.py).
- sglang-router sends each request to prefill and to decode at once with `bootstrap_room`. The rooms, their
  claims, bounds and expiry are pd/rooms.py's `PrefillRooms`; this backend parses, calls and answers. Prefill's
  HTTP half is admitted into the Engine with `export_after_prefill`: batched and chunked by the same Scheduler
  as every other request; once the prompt is cached the first token is sampled, the caches are exported and
  the pages freed, and the export (`PrefillExport`: caches, first token, random stream, prefill timings) comes
  back with the request's result. Then the room waits for decode's claim (it usually came first), the payload
  and its typed `PrefillResult` go to that session's decode over the transfer backend (zmq or shm, one lane per
  session: pd/outbox.py; decode verifies it against the registration and acknowledges), and the HTTP half
  answers with the first token.
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
import contextlib
import dataclasses
import functools
import logging
import time
from collections.abc import AsyncIterator
from typing import TYPE_CHECKING, Any, cast

import zmq
import zmq.asyncio

from specctl.engine.async_engine import RequestOutput
from specctl.engine.pd import wire
from specctl.engine.pd.bootstrap import BootstrapServer, Peer
from specctl.engine.pd.messages import PdDone, PdProgress, PrefillResult, room_key
from specctl.engine.pd.outbox import TransferOutbox
from specctl.engine.pd.registration import build_registration
from specctl.engine.pd.rooms import PrefillRooms, Room, RoomFailure
from specctl.engine.pd.transfer import PayloadSpec
from specctl.engine.serve.backend import (
    EngineBackend,
    RoleContext,
    draft_runner_of,
    secret_of,
    warn_unauthenticated,
)
from specctl.engine.serve.http import RequestError
from specctl.engine.serve.metrics import ServingMetrics
from specctl.errors import UsageError

if TYPE_CHECKING:  # torch, and the PD modules this one imports lazily
    import torch

    from specctl.engine.pd.bootstrap import BootstrapServer
    from specctl.engine.pd.registration import RegistrationInfo
    from specctl.engine.pd.transfer import TransferResult
    from specctl.engine.prefill_export import PrefillExport
    from specctl.engine.sampling_params import SamplingParams
    from specctl.engine.serve.openai_request import PdRoute

log = logging.getLogger("specctl.prefill")

# A session not heard from this long (decode pings every second) fails the rooms it holds at once.
STALE_SESSION_S = 5.0


def _sent(fut: asyncio.Future[Any], req_id: str) -> None:
    if not fut.cancelled() and fut.exception() is not None:
        log.debug("could not answer decode for %s: %s", req_id, fut.exception())  # decode is gone


def claim_bytes_bound(max_context: int) -> int:
    """The largest control message prefill accepts: a claim of `max_context` prompt ids plus its parameters."""
    return 9 * int(max_context) + wire.MAX_CONTROL_BYTES


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
        self.rooms = PrefillRooms(timeout_s=ctx.timeout_s, max_context=self.max_context, reply=self._reply_to,
                                  peer_for=self._peer_for, auth_required=self._auth_required)
        self._bg: list[asyncio.Task[None]] = []
        self.transfer_s = 0.0
        self.compute_s = 0.0

    # lifecycle ------------------------------------------------------------------------------------
    async def load(self) -> None:
        await super().load()
        assert self.aengine is not None and self.engine is not None
        engine = self.engine
        self.rooms.max_context = self.max_context  # the engine's own limit, known once it is built
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

    def _peer_for(self, session_id: str) -> Peer | None:
        return self.bootstrap.peer_for(session_id) if self.bootstrap is not None else None

    def _auth_required(self) -> bool:
        return self.bootstrap is None or self.bootstrap.auth_required

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
        await self.rooms.aclose()
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
        if route is None:
            raise RequestError("this is a prefill server: it serves disaggregated requests from sglang-router "
                               "(bootstrap_host, bootstrap_port, bootstrap_room); send requests to the router",
                               param="bootstrap_room")
        if self.rooms.serving(room_key(route.room)):  # generate() would fail it as a 503
            raise RequestError(f"bootstrap_room {route.room} is already being served by this prefill; "
                               "each request needs a room of its own", param="bootstrap_room", status=409,
                               code="room_in_use")

    def health(self) -> tuple[bool, dict[str, Any]]:
        if self.bootstrap is not None:
            self.ctx.state.extra["paired"] = len(self.bootstrap.peers)
        return super().health()

    def load_info(self) -> dict[str, int]:
        return {"num_reqs": len(self.rooms)}

    async def generate(self, prompt_ids: list[int], params: SamplingParams, *, route: PdRoute | None = None,
                       stream: bool = True) -> AsyncIterator[RequestOutput]:
        """The HTTP half of one room: prefill it in the Engine, wait for its claim, send, answer token 1
        (one token either way, so `stream` changes nothing here)."""
        assert route is not None  # check_params refused a request without one
        key = room_key(route.room)
        try:
            room = self.rooms.open(key, list(prompt_ids))
        except RoomFailure as exc:
            yield RequestOutput([], True, "error", str(exc))
            return
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.ctx.timeout_s
        error: str | None = None
        error_status: int | None = None
        try:
            out = await self._prefill(list(prompt_ids), params)
            export = out.prefilled
            if out.finish_reason != "prefilled" or export is None:
                raise RoomFailure(out.error or f"prefill did not complete ({out.finish_reason})")
            self.compute_s += float(out.timings.get("ttft_s", 0.0))
            await self.rooms.wait_claim(room, deadline - loop.time())
            sent = await self._send(room, export)
            self.transfer_s += sent.seconds
            self.ctx.metrics.transfer_bytes.inc(sent.nbytes, direction="sent")
            self.ctx.metrics.transfer_seconds.observe(sent.seconds)
            self.ctx.metrics.record_prefill(prompt_tokens=len(prompt_ids), compute_s=export.compute_s)
            timings = {**out.timings, "queue_s": export.queue_s, "compute_s": export.compute_s}
            self.rooms.close(room)
            yield RequestOutput([export.first_token], True, "length", completion_tokens=1, timings=timings)
            return
        except RoomFailure as exc:
            error, error_status = str(exc), exc.status
        except asyncio.CancelledError:
            error = "aborted"
            raise
        except Exception as exc:  # transfer error or timeout: fail this room only
            error = f"{type(exc).__name__}: {exc}"
            self.ctx.metrics.transfer_failures.inc(reason=type(exc).__name__)
        finally:
            if error is not None:
                self.rooms.close(room, error, error_status)
        if error != "aborted":
            yield RequestOutput([], True, "error", error, error_status=error_status)

    async def _prefill(self, prompt_ids: list[int], params: SamplingParams) -> RequestOutput:
        """Run the prompt through the Engine with `export_after_prefill`; the final output carries the export."""
        # Prefill samples token 1 only; decode applies the request's stop conditions to it (add_imported),
        # so here nothing may finish the request before its caches are exported.
        sp = dataclasses.replace(params, max_tokens=2, stop=(), ignore_eos=True)
        assert self.aengine is not None
        final = RequestOutput([], True, "error", "prefill produced no result")
        async for item in self.aengine.generate(
                prompt_ids, sp, admit=lambda eng: eng.add_request(prompt_ids, sp, export_after_prefill=True)):
            if item.finished:
                final = item
        return final

    def _empty_draft(self) -> dict[str, torch.Tensor]:
        """The draft's components for zero cached tokens. Prefill does not run the draft model: decode's
        drafter builds its cache from the prompt at its first step, as a colocated engine does after its first
        token, so the draft's prefill stays out of TTFT. The components are still sent (the registration
        fixes them) and `draft_length: 0` tells decode they hold nothing."""
        import torch  # noqa: PLC0415 - torch: the engine extra; the torch-free install and `specctl validate` never load it

        runner = draft_runner_of(self.engine)
        if runner is None:
            return {}
        dtype = getattr(torch, runner.layout().dtype)
        out = {}
        for name, shape in runner.cache.export_shapes(0).items():
            out[f"draft.{name}"] = torch.zeros(shape, dtype=torch.float32 if name == "mamba_ssm" else dtype)
        return out

    async def _send(self, room: Room, export: PrefillExport) -> TransferResult:
        exported: dict[str, Any] = {**export.tensors, **self._empty_draft()}
        export.tensors = {}
        tensors = {n: exported[n] for n in self._component_order if n in exported}
        tensors.update({n: t for n, t in exported.items() if n not in tensors})
        assert room.prompt_ids is not None  # rooms.open() set it
        marker = self.faults.prefill_corrupt_marker
        if marker and marker in self.decode(room.prompt_ids):  # the test's FaultPlan (serve/faults.py)
            tensors = dict(reversed(list(tensors.items())))
        if self.faults.prefill_hold_s > 0:
            await asyncio.sleep(self.faults.prefill_hold_s)
        self.rooms.check_live(room)
        assert room.peer is not None  # wait_claim() returned: the claim came with its session
        endpoint = str(room.peer.info.endpoints["transfer"])
        result = PrefillResult(first_token=export.first_token, rng_state=export.rng_state, draft_length=0,
                               queue_s=export.queue_s, compute_s=export.compute_s, sent_at=time.time())
        assert self._outbox is not None  # load() built it
        # The room's own lane: a slow or stopped decode holds up only its own session's rooms.
        fut = self._outbox.submit(room.peer.session_id, endpoint, room.peer.transfer, room.key, tensors,
                                  length=export.length, result=result)
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
                self.rooms.on_control(frames[0], frames[1:])
            except Exception:  # one bad message never stops the loop
                log.exception("control message failed")

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

    # info -----------------------------------------------------------------------------------------
    async def server_info(self) -> dict[str, Any]:
        info = await super().server_info()
        # The fingerprint only: the registration itself is what a stranger would need to claim to be a peer.
        info["fingerprints"]["registration"] = self.info.fingerprint() if self.info else None
        info["pool"] = await self._pool()
        info["in_flight"] = len(self.rooms)
        stats = vars(self.bootstrap.stats) if self.bootstrap else {}
        # Endpoints are no secret: claiming a room needs a session (ids never leave the handshake) and, with a
        # shared secret, that session's key.
        info["bootstrap"] = {**stats, "sessions": len(self.bootstrap.peers) if self.bootstrap else 0,
                             "rejected_by_reason": self.pd_rejections(),
                             "auth_failures": self.rooms.auth_failures, "authenticated": bool(secret_of(self.ctx)),
                             "endpoint": self.bootstrap.endpoint if self.bootstrap else None,
                             "control": self.info.endpoints.get("control") if self.info else None}
        done = self.rooms.completed
        info["timing"].update({"completed": done, "failed": self.rooms.failed,
                               "mean_compute_s": self.compute_s / done if done else None,
                               "mean_transfer_s": self.transfer_s / done if done else None})
        return info

    async def _pool(self) -> dict[str, int]:
        if self.aengine is None:
            return {}
        return dict(await self.aengine.call(lambda eng: {"free_pages": int(eng.runner.num_free_pages),
                                                         "total_pages": int(eng.runner.num_total_pages)}))

    async def refresh_metrics(self, metrics: ServingMetrics) -> None:
        await super().refresh_metrics(metrics)
        metrics.pd_sessions.set(len(self.bootstrap.peers) if self.bootstrap is not None else 0)
        metrics.pd_claims_waiting.set(self.rooms.claims_waiting())
        metrics.pd_transfers_in_flight.set(sum(self._outbox.in_flight().values()) if self._outbox else 0)
        for reason, n in self.pd_rejections().items():
            metrics.pd_rejected.mirror(n, reason=reason)

    def pd_rejections(self) -> dict[str, int]:
        """Every PD-plane refusal of this prefill by reason: control messages and the bootstrap's refusals."""
        out = dict(self.rooms.rejections)
        if self.bootstrap is not None:
            for kind, n in self.bootstrap.stats.rejected_by.items():
                out[f"bootstrap_{kind}"] = n
        return out


