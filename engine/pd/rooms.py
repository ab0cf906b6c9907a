"""Bootstrap rooms: the per-request state machine of a disaggregated pair, apart from HTTP and the engine.

A room (`room_key(bootstrap_room)`) has two halves: the router's HTTP request, which reaches prefill and decode
at once, and decode's claim (`PdClaim`) on prefill's control socket. Torch-free and transport-free: the caller
hands in received control frames and gets its replies through the `reply(identity, peer, message)` callable it
gave, so the whole machine runs in a unit test.

Prefill's side, `PrefillRooms` (one per prefill process, used from its event loop):

- `on_control(identity, frames)`: one control message from a decode. It is parsed (a malformed one is a counted
  refusal, `malformed`), its session looked up (`peer_for(session id)`; an unknown session is answered with
  `PdDone` "re-register" when pairing needs no secret, else refused and counted, `session`) and its MAC and
  counter checked with that session's key (a forgery or a replay is refused and counted under the seal's
  reason); nothing is acted on before that. A claim is then bounded: a prompt over `max_context` ids is
  answered 413 (`prompt_size`); claims whose HTTP half has not come are capped per session
  (`max_unmatched_per_session`) and in all (`max_waiting`), refused over the cap (`claims`); a room claimed
  twice is answered with an error. An accepted claim is answered `PdProgress("queued")`, and `started` once
  both halves are present. An abort from the session holding the room marks it aborted.
- `open(key, prompt_ids)`: the HTTP half arrives; `wait_claim(room, deadline)`: the claim of that room, or
  `RoomFailure` — 408 when no decode claimed it in time, 400 when the two halves carry different prompts, 503
  when decode aborted it.
- A claim whose HTTP half never comes expires after `timeout_s`: the room is dropped and decode gets `PdDone`
  with status 408 (the client posted to one side only).
- `close(room, error, status)`: the room leaves the table; a failed room that decode claimed (and did not abort)
  is answered with `PdDone` carrying the same status, so both halves fail alike.

Decode's side, `DecodeRooms`: each claimed room's wait for its payload, timed by prefill's liveness, and the
session keys of rooms just closed (see the class).

Every room leaves its table: completed, failed, or expired (a claim without its HTTP half, or an HTTP half without
its claim, `timeout_s` after it came; a claimed room waiting for its payload, `timeout_s` after prefill's last sign
of progress).
"""

from __future__ import annotations

import asyncio
import collections
import dataclasses
import logging
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Generic, TypeVar

from specctl.engine.pd import wire
from specctl.engine.pd.messages import PdAbort, PdClaim, PdDone, PdProgress

if TYPE_CHECKING:
    from specctl.engine.pd.bootstrap import Peer

log = logging.getLogger("specctl.pd.rooms")

BOTH_HALVES = "a request with bootstrap_room goes to a prefill and a decode both (sglang-router does this)"
MAX_UNMATCHED_CLAIMS = 256  # per session: claims waiting for an HTTP half (each expires in transfer.timeout_s)
MAX_WAITING_CLAIMS = 1024  # all sessions together

Reply = Callable[[bytes, "Peer | None", "PdProgress | PdDone"], None]
P = TypeVar("P")  # decode's payload (pd/transfer.py Payload); opaque here


class RoomFailure(Exception):
    """A PD request fails; `status` is the HTTP status when the client can fix it (else the server's 503)."""

    def __init__(self, message: str, status: int | None = None) -> None:
        super().__init__(message)
        self.status = status


@dataclasses.dataclass(eq=False)
class Room:
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


class PrefillRooms:
    """Prefill's room table: claims, HTTP halves, expiry and the refusals of decode's control messages."""

    def __init__(
        self,
        *,
        timeout_s: float,
        max_context: int,
        reply: Reply,
        peer_for: Callable[[str], Peer | None],
        auth_required: Callable[[], bool],
        max_unmatched_per_session: int = MAX_UNMATCHED_CLAIMS,
        max_waiting: int = MAX_WAITING_CLAIMS,
    ) -> None:
        self.timeout_s = float(timeout_s)
        self.max_context = int(max_context)
        self._reply = reply
        self._peer_for = peer_for
        self._auth_required = auth_required
        self.max_unmatched_per_session = int(max_unmatched_per_session)
        self.max_waiting = int(max_waiting)
        self.rooms: dict[str, Room] = {}
        self.rejections: collections.Counter[str] = collections.Counter()  # refused control messages, by reason
        self.auth_failures = 0
        self.completed = 0
        self.failed = 0
        self._expiries: set[asyncio.Task[None]] = set()

    def __len__(self) -> int:
        return len(self.rooms)

    def serving(self, key: str) -> bool:
        """Whether `key`'s HTTP half is already here (a second one is refused)."""
        room = self.rooms.get(key)
        return room is not None and room.prompt_ids is not None

    def claims_waiting(self) -> int:
        """Claims whose HTTP half has not come (a metric)."""
        return sum(1 for r in self.rooms.values() if r.claim is not None and not r.http.is_set())

    # the HTTP half ---------------------------------------------------------------------------------
    def open(self, key: str, prompt_ids: list[int]) -> Room:
        """The HTTP half of `key` arrives; RoomFailure when this room already has one."""
        room = self.rooms.setdefault(key, Room(key))
        if room.prompt_ids is not None:
            raise RoomFailure(f"{key} was already sent to this prefill")
        room.prompt_ids = list(prompt_ids)
        room.http.set()
        if room.claim is not None:
            self.send(room, PdProgress(req_id=key, stage="started"))
        return room

    async def wait_claim(self, room: Room, timeout_s: float) -> PdClaim:
        """The claim of `room` (waiting at most `timeout_s`), checked against the HTTP half's prompt."""
        if not room.claimed.is_set():
            try:
                await asyncio.wait_for(room.claimed.wait(), max(0.0, timeout_s))
            except asyncio.TimeoutError:
                raise RoomFailure(f"no decode claimed {room.key} within {self.timeout_s:g}s (transfer.timeout_s): "
                                  f"the router's request never reached a paired decode; {BOTH_HALVES}",
                                  status=408) from None
        self.check_live(room)
        claim = room.claim
        assert claim is not None and room.peer is not None  # set together by on_control before `claimed`
        if room.prompt_ids is not None and list(claim.prompt_ids) != room.prompt_ids:  # the sender's fault: a 4xx
            raise RoomFailure(f"{room.key}: decode and prefill received different prompts ({len(claim.prompt_ids)} "
                              f"vs {len(room.prompt_ids)} tokens); the router must send the same request to both",
                              status=400)
        return claim

    def check_live(self, room: Room) -> None:
        """RoomFailure when decode aborted `room`."""
        if room.aborted:
            raise RoomFailure(f"{room.key}: decode aborted it ({room.aborted})")

    def close(self, room: Room, error: str | None = None, status: int | None = None) -> None:
        """`room` leaves the table, done (`error` None) or failed; decode hears of a failure with the same status."""
        if self.rooms.get(room.key) is room:
            del self.rooms[room.key]
        if error is None:
            self.completed += 1
            return
        self.failed += 1
        log.warning("%s failed on prefill: %s", room.key, error)
        if room.claim is not None and not room.aborted:
            self.send(room, PdDone(req_id=room.key, error=error, status=status or 0))

    def send(self, room: Room, msg: PdProgress | PdDone) -> None:
        """A reply to the decode that claimed `room` (nothing before a claim)."""
        if room.claim is not None:
            self._reply(room.identity, room.peer, msg)

    # decode's control messages ---------------------------------------------------------------------
    def on_control(self, identity: bytes, frames: list[bytes]) -> None:
        """One control message from a decode (see the module docstring); never raises for a peer's bytes."""
        try:
            # Parse first to learn the session, then check the MAC with that session's key (msgspec decoding is
            # safe on untrusted bytes; nothing is acted on before the MAC is checked).
            msg = wire.decode(frames[:1], as_torch=False, expect=(PdClaim, PdAbort)).msg
            if not isinstance(msg, (PdClaim, PdAbort)):
                raise wire.WireError(f"unexpected {type(msg).__name__}")
        except wire.WireError as exc:
            self._refuse("malformed", f"refused a malformed control message: {exc}")
            return
        peer = self._peer_for(msg.pairing_id)
        if peer is None:
            if isinstance(msg, PdClaim) and not self._auth_required():
                self._reply(identity, None, PdDone(req_id=msg.req_id, error=(
                    "prefill is not paired with this decode (it restarted, or the session expired); re-register")))
            else:
                self._refuse("session", "refused a control message for an unknown session")
            return
        if peer.control.open(frames) is None:  # forged, or a replay of a message already seen
            self._refuse(peer.control.last_refusal or "auth", "refused a control message that failed "
                         f"authentication or was replayed ({peer.control.last_refusal}, session {peer.generation})")
            return
        peer.last_seen = time.monotonic()
        if isinstance(msg, PdAbort):
            self._on_abort(msg, peer)
        else:
            self._on_claim(msg, identity, peer)

    def _refuse(self, reason: str, text: str) -> None:
        self.auth_failures += 1
        self.rejections[reason] += 1
        log.warning("%s", text)

    def _on_abort(self, msg: PdAbort, peer: Peer) -> None:
        room = self.rooms.get(msg.req_id)
        if room is not None and room.peer is not None and room.peer.session_id == peer.session_id:
            room.aborted = msg.reason
            room.claimed.set()

    def _on_claim(self, msg: PdClaim, identity: bytes, peer: Peer) -> None:
        room = self.rooms.get(msg.req_id)
        if room is not None and room.claim is not None:
            self._reply(identity, peer, PdDone(req_id=msg.req_id, error=f"{msg.req_id} is already claimed"))
            return
        if len(msg.prompt_ids) > self.max_context:
            self.rejections["prompt_size"] += 1
            self._reply(identity, peer, PdDone(req_id=msg.req_id, status=413, error=(
                f"the claim's prompt has {len(msg.prompt_ids)} tokens, over this prefill's {self.max_context}")))
            return
        if room is None:
            # Claims whose HTTP half has not come are bounded per session and in all: a peer cannot pile them up.
            unmatched = [r for r in self.rooms.values() if r.peer is not None and not r.http.is_set()]
            waiting = sum(1 for r in unmatched if r.peer is not None and r.peer.session_id == peer.session_id)
            if waiting >= self.max_unmatched_per_session or len(unmatched) >= self.max_waiting:
                self.rejections["claims"] += 1
                self._reply(identity, peer, PdDone(req_id=msg.req_id, error=(
                    f"{waiting} claims of this session ({len(unmatched)} in all) wait for rooms prefill never "
                    "received; refused")))
                return
            room = self.rooms[msg.req_id] = Room(msg.req_id)
            task = asyncio.get_running_loop().create_task(self._expire_unsent(room))
            self._expiries.add(task)
            task.add_done_callback(self._expiries.discard)
        room.claim, room.identity, room.peer = msg, identity, peer
        room.claimed.set()
        self._reply(identity, peer, PdProgress(req_id=msg.req_id, stage="queued"))
        if room.http.is_set():
            self._reply(identity, peer, PdProgress(req_id=msg.req_id, stage="started"))

    async def _expire_unsent(self, room: Room) -> None:
        """A claim whose HTTP half never reaches this prefill fails within the transfer timeout."""
        try:
            await asyncio.wait_for(room.http.wait(), self.timeout_s)
        except asyncio.TimeoutError:
            if self.rooms.get(room.key) is room:
                del self.rooms[room.key]
                self.failed += 1
                log.warning("%s: the router's request never reached this prefill", room.key)
                self.send(room, PdDone(req_id=room.key, status=408, error=(
                    f"the router's request for {room.key} never reached prefill within {self.timeout_s:g}s "
                    f"(transfer.timeout_s); {BOTH_HALVES}")))

    async def aclose(self) -> None:
        """Stop every pending expiry (the process is stopping)."""
        tasks = list(self._expiries)
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)


@dataclasses.dataclass(eq=False)
class _Claim(Generic[P]):
    """One room decode claimed: which prefill link holds it, its payload's future, prefill's latest stage."""

    link: int
    future: asyncio.Future[P]
    stage: str
    since: float  # clock time of `stage`


class DecodeRooms(Generic[P]):
    """Decode's room table: each claimed room's wait for its payload, measured by prefill's liveness.

    - `open(room, link)` before the claim is sent; `wait(room)` returns the payload, or raises `RoomFailure`
      when prefill shows no progress for `timeout_s`: from the claim until prefill holds it (`sent`), from
      `started` until the payload, and while `queued` from that prefill's last progress on any room (prefill
      fails a room whose HTTP half never comes itself; if it does not, the wait ends with a 408: the client
      posted to one side only).
    - `on_message(link, msg)`: prefill's `PdProgress` / `PdDone` for a room of that link (a `PdDone` fails the
      room with prefill's status); `resolve(room, payload, error)`: the transfer's outcome. A payload nobody
      waits for any more is released at once (`release(payload)`).
    - `fail_link(link, reason)`: the prefill is gone; its rooms fail now, not one timeout each.
    - `close(room, key)`: the room is done; its session `key` is remembered for `2 * timeout_s`
      (`recent_key`), so a payload that arrives late is still authenticated, acknowledged and dropped instead of
      leaving prefill's sender waiting for an ack.

    Used from decode's event loop; `link_of` and `recent_key` may be read from the transfer thread.
    """

    def __init__(self, *, timeout_s: float, clock: Callable[[], float], release: Callable[[P], None]) -> None:
        self.timeout_s = float(timeout_s)
        self._clock = clock
        self._release = release
        self.claims: dict[str, _Claim[P]] = {}
        self.progress_at: dict[int, float] = {}  # link -> clock time of its prefill's latest progress on any room
        self._recent: dict[str, tuple[bytes, float]] = {}  # room -> (its session key, clock time it expires)

    def __len__(self) -> int:
        return len(self.claims)

    def __contains__(self, room: object) -> bool:
        return room in self.claims

    def link_of(self, room: str) -> int | None:
        claim = self.claims.get(room)
        return None if claim is None else claim.link

    def recent_key(self, room: str) -> bytes | None:
        recent = self._recent.get(room)
        return None if recent is None else recent[0]

    def open(self, room: str, link: int) -> None:
        """Claim `room` through `link`; RoomFailure when this decode already serves it."""
        if room in self.claims:
            raise RoomFailure(f"{room} is already being served by this decode")
        self.claims[room] = _Claim(link, asyncio.get_running_loop().create_future(), "sent", self._clock())

    async def wait(self, room: str) -> P:
        """The room's payload; RoomFailure when prefill stops showing progress (see the class docstring)."""
        claim = self.claims[room]
        timeout = self.timeout_s
        if claim.stage == "sent":
            claim.since = self._clock()  # the claim is on its way now
        while True:
            since = claim.since
            if claim.stage == "queued":
                since = max(since, self.progress_at.get(claim.link, 0.0))
            remaining = since + timeout - self._clock()
            if remaining <= 0:
                if claim.stage == "queued":
                    # Prefill holds the claim but never got the request itself: the client (or a router) sent
                    # it to this decode alone. The client's to fix, so a 408, not a 5xx.
                    raise RoomFailure(f"{room}: prefill never received this request within {timeout:g}s "
                                      f"(transfer.timeout_s); {BOTH_HALVES}", status=408)
                raise RoomFailure(f"{room}: " + (
                    f"prefill did not acknowledge the claim within {timeout:g}s" if claim.stage == "sent"
                    else f"prefill sent no KV within {timeout:g}s of starting the room") + " (transfer.timeout_s)")
            done, _ = await asyncio.wait({claim.future}, timeout=min(remaining, 1.0))
            if done:
                return claim.future.result()

    def on_message(self, link: int, msg: PdProgress | PdDone) -> None:
        now = self._clock()
        claim = self.claims.get(msg.req_id)
        if isinstance(msg, PdProgress):
            if claim is not None:
                claim.stage, claim.since = msg.stage, now
            if msg.stage != "queued":
                self.progress_at[link] = now
            return
        self.progress_at[link] = now
        if claim is not None and claim.link == link and not claim.future.done():
            claim.future.set_exception(RoomFailure(f"{msg.req_id}: prefill failed: {msg.error}",
                                                   status=msg.status or None))

    def resolve(self, room: str, payload: P | None, error: BaseException | None) -> None:
        """The transfer's outcome for `room`: its payload, or the error that failed it."""
        claim = self.claims.get(room)
        if claim is not None:
            self.progress_at[claim.link] = self._clock()
        if claim is None or claim.future.done():
            if payload is not None:
                self._release(payload)  # nobody waits for it any more (aborted or timed out)
            return
        if error is not None:
            claim.future.set_exception(error)
        elif payload is not None:
            claim.future.set_result(payload)

    def fail_link(self, link: int, reason: str) -> None:
        """Every room waiting on `link` fails now, naming `reason`."""
        for room, claim in list(self.claims.items()):
            if claim.link == link and not claim.future.done():
                claim.future.set_exception(RoomFailure(f"{room}: {reason}"))

    def close(self, room: str, key: bytes | None) -> None:
        """`room` is done; remember its session `key` a while for a payload still on its way."""
        claim = self.claims.pop(room, None)
        if claim is not None and not claim.future.done():
            claim.future.cancel()
        if claim is None or key is None:
            return
        now = self._clock()
        for rid, (_, until) in list(self._recent.items()):
            if until < now:
                del self._recent[rid]
        self._recent[room] = (key, now + 2 * self.timeout_s)
