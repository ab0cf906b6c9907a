"""Prefill's room state machine (`engine/pd/rooms.py`) on its own: no HTTP, no engine, no socket. Decode's control
messages are real wire bytes (sealed with a session key where the case needs one), the replies are what prefill
would send back. Each bound and refusal of the PD plane is checked where it is decided: claims before and after
the HTTP half, expiry of a half that never comes (408 both ways), mismatched prompts (400), aborts by the
claiming session only, the per-session and global claim caps, oversized prompts (413), malformed, unknown-session,
forged and replayed messages (each a counted refusal). Decode's side: a room's wait for its payload ends with the
payload, prefill's own failure, a lost link, or when prefill stops showing progress; a late payload is released."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Coroutine
from typing import Any

import pytest

from specctl.engine.pd import wire
from specctl.engine.pd.bootstrap import Peer, control_seal
from specctl.engine.pd.messages import PdAbort, PdClaim, PdDone, PdProgress
from specctl.engine.pd.rooms import DecodeRooms, PrefillRooms, RoomFailure

from test_handshake_bootstrap import _dec  # isort: skip

KEY = b"k" * 32


class Decode:
    """One paired decode as prefill's rooms see it: its Peer (prefill's view) and its own sealing side."""

    def __init__(self, session: str, key: bytes | None = None) -> None:
        self.peer = Peer(info=_dec(), session_id=session, generation=1, paired_at=0.0, key=key)
        self.seal = control_seal(key, "decode")
        self.identity = session.encode()[:8]

    def frames(self, msg: PdClaim | PdAbort) -> list[bytes]:
        return self.seal.seal([bytes(f) for f in wire.encode(msg)])

    def claim(self, room: str, prompt: list[int]) -> list[bytes]:
        return self.frames(PdClaim(req_id=room, prompt_ids=prompt, pairing_id=self.peer.session_id))

    def abort(self, room: str) -> list[bytes]:
        return self.frames(PdAbort(req_id=room, pairing_id=self.peer.session_id, reason="client left"))


class Harness:
    def __init__(self, *decodes: Decode, auth: bool = False, **kw: Any) -> None:
        self.decodes = {d.peer.session_id: d for d in decodes}
        self.replies: list[tuple[bytes, str | None, PdProgress | PdDone]] = []
        self.rooms = PrefillRooms(
            timeout_s=kw.pop("timeout_s", 5.0), max_context=kw.pop("max_context", 64), reply=self._reply,
            peer_for=lambda sid: self.decodes[sid].peer if sid in self.decodes else None,
            auth_required=lambda: auth, **kw)

    def _reply(self, identity: bytes, peer: Peer | None, msg: PdProgress | PdDone) -> None:
        self.replies.append((identity, peer.session_id if peer is not None else None, msg))

    def send(self, d: Decode, frames: list[bytes]) -> None:
        self.rooms.on_control(d.identity, frames)

    def said(self) -> list[tuple[str, str]]:
        """(room, stage or 'done:<status>') of every reply so far, then forget them."""
        out = [(m.req_id, m.stage if isinstance(m, PdProgress) else f"done:{m.status}") for _, _, m in self.replies]
        self.replies.clear()
        return out


def run(coro: Coroutine[Any, Any, Any]) -> Any:
    return asyncio.run(asyncio.wait_for(coro, 30))


def test_a_claim_then_its_http_half_serves_the_room_and_answers_only_progress() -> None:
    async def go() -> None:
        d = Decode("a" * 32)
        h = Harness(d)
        h.send(d, d.claim("room-1", [1, 2, 3]))
        assert h.said() == [("room-1", "queued")] and h.rooms.claims_waiting() == 1
        room = h.rooms.open("room-1", [1, 2, 3])
        assert h.said() == [("room-1", "started")] and h.rooms.serving("room-1")
        claim = await h.rooms.wait_claim(room, 1.0)
        assert claim.prompt_ids == [1, 2, 3] and room.peer is d.peer
        h.rooms.close(room)
        assert len(h.rooms) == 0 and h.rooms.completed == 1 and h.said() == []
        h.rooms.open("room-2", [4])
        with pytest.raises(RoomFailure, match="already sent"):  # a room's HTTP half comes once
            h.rooms.open("room-2", [4])
        await h.rooms.aclose()

    run(go())


def test_the_http_half_first_then_the_claim_is_answered_queued_and_started_at_once() -> None:
    async def go() -> None:
        d = Decode("a" * 32)
        h = Harness(d)
        room = h.rooms.open("room-1", [7, 8])
        waiter = asyncio.ensure_future(h.rooms.wait_claim(room, 5.0))
        await asyncio.sleep(0)
        h.send(d, d.claim("room-1", [7, 8]))
        assert (await waiter).req_id == "room-1"
        assert h.said() == [("room-1", "queued"), ("room-1", "started")]
        await h.rooms.aclose()

    run(go())


def test_a_half_that_never_comes_fails_the_room_with_a_408_on_both_sides() -> None:
    async def go() -> None:
        d = Decode("a" * 32)
        h = Harness(d, timeout_s=0.3)
        h.send(d, d.claim("room-1", [1]))  # the router's request never reaches prefill
        h.said()
        await asyncio.sleep(0.6)
        assert h.said() == [("room-1", "done:408")] and len(h.rooms) == 0 and h.rooms.failed == 1
        room = h.rooms.open("room-2", [1])  # and a request no decode ever claims
        with pytest.raises(RoomFailure, match="no decode claimed room-2") as err:
            await h.rooms.wait_claim(room, 0.3)
        assert err.value.status == 408
        await h.rooms.aclose()

    run(go())


def test_different_prompts_on_the_two_halves_are_the_senders_fault() -> None:
    async def go() -> None:
        d = Decode("a" * 32)
        h = Harness(d)
        h.send(d, d.claim("room-1", [1, 2, 3]))
        room = h.rooms.open("room-1", [1, 2, 4])
        with pytest.raises(RoomFailure, match="different prompts") as err:
            await h.rooms.wait_claim(room, 1.0)
        assert err.value.status == 400
        h.said()
        h.rooms.close(room, str(err.value), err.value.status)  # decode hears the same status
        assert h.said() == [("room-1", "done:400")] and h.rooms.failed == 1
        await h.rooms.aclose()

    run(go())


def test_only_the_claiming_session_aborts_a_room_and_an_aborted_room_is_not_answered() -> None:
    async def go() -> None:
        a, b = Decode("a" * 32), Decode("b" * 32)
        h = Harness(a, b)
        h.send(a, a.claim("room-1", [1]))
        room = h.rooms.open("room-1", [1])
        h.send(b, b.abort("room-1"))  # another session's abort changes nothing
        assert room.aborted is None
        h.send(a, a.abort("room-1"))
        with pytest.raises(RoomFailure, match="decode aborted it \\(client left\\)"):
            await h.rooms.wait_claim(room, 1.0)
        h.said()
        h.rooms.close(room, "aborted by decode")
        assert h.said() == []  # decode already dropped the room
        await h.rooms.aclose()

    run(go())


def test_claims_without_their_http_half_are_capped_per_session_and_in_all() -> None:
    async def go() -> None:
        a, b, c = Decode("a" * 32), Decode("b" * 32), Decode("c" * 32)
        h = Harness(a, b, c, max_unmatched_per_session=2, max_waiting=3)
        for i in range(3):
            h.send(a, a.claim(f"room-a{i}", [1]))
        assert h.said() == [("room-a0", "queued"), ("room-a1", "queued"), ("room-a2", "done:0")]
        h.send(b, b.claim("room-b0", [1]))  # another session still gets in
        h.send(c, c.claim("room-c0", [1]))  # ... until the global cap
        assert h.said() == [("room-b0", "queued"), ("room-c0", "done:0")]
        assert h.rooms.rejections["claims"] == 2 and h.rooms.claims_waiting() == 3
        h.rooms.open("room-a0", [1])  # a matched claim no longer counts
        h.send(c, c.claim("room-c1", [1]))
        assert h.said()[-1] == ("room-c1", "queued")
        await h.rooms.aclose()

    run(go())


def test_a_prompt_over_max_context_and_a_second_claim_are_refused() -> None:
    async def go() -> None:
        d = Decode("a" * 32)
        h = Harness(d, max_context=4)
        h.send(d, d.claim("room-1", [1] * 5))
        assert h.said() == [("room-1", "done:413")] and h.rooms.rejections["prompt_size"] == 1 and len(h.rooms) == 0
        h.send(d, d.claim("room-2", [1]))
        h.send(d, d.claim("room-2", [1]))
        assert h.said() == [("room-2", "queued"), ("room-2", "done:0")]
        await h.rooms.aclose()

    run(go())


def test_malformed_unknown_session_forged_and_replayed_messages_are_counted_refusals() -> None:
    async def go() -> None:
        d = Decode("a" * 32, key=KEY)
        stranger = Decode("s" * 32, key=b"x" * 32)
        h = Harness(d, auth=True)
        h.send(d, [b"\x93not a header"])
        h.send(stranger, stranger.claim("room-1", [1]))  # a session prefill does not know
        forged = Decode("a" * 32, key=b"x" * 32)  # the right session id, the wrong key
        h.send(d, forged.claim("room-2", [1]))
        good = d.claim("room-3", [1])
        h.send(d, good)
        h.send(d, good)  # a captured claim replayed
        assert h.said() == [("room-3", "queued")]  # nothing else was acted on or answered
        assert dict(h.rooms.rejections) == {"malformed": 1, "session": 1, "auth": 1, "stale": 1}
        assert h.rooms.auth_failures == 4 and list(h.rooms.rooms) == ["room-3"]
        await h.rooms.aclose()

    run(go())


def test_an_unknown_session_is_told_to_re_register_when_pairing_needs_no_secret() -> None:
    async def go() -> None:
        gone = Decode("g" * 32)
        h = Harness(auth=False)
        h.send(gone, gone.claim("room-1", [1]))
        ((identity, session, msg),) = h.replies
        assert identity == gone.identity and session is None
        assert isinstance(msg, PdDone) and "re-register" in msg.error and h.rooms.rejections == {}
        await h.rooms.aclose()

    run(go())


class _Payload:
    def __init__(self, room: str) -> None:
        self.room = room
        self.released = False


def _decode_rooms(timeout_s: float = 5.0) -> DecodeRooms[_Payload]:
    return DecodeRooms(timeout_s=timeout_s, clock=time.monotonic, release=lambda p: setattr(p, "released", True))


def test_decode_waits_for_its_payload_and_a_late_one_is_released_under_the_rooms_key() -> None:
    async def go() -> None:
        rooms = _decode_rooms()
        rooms.open("room-1", 1)
        with pytest.raises(RoomFailure, match="already being served"):
            rooms.open("room-1", 2)
        assert rooms.link_of("room-1") == 1 and "room-1" in rooms
        waiter = asyncio.ensure_future(rooms.wait("room-1"))
        rooms.on_message(1, PdProgress(req_id="room-1", stage="started"))
        payload = _Payload("room-1")
        rooms.resolve("room-1", payload, None)
        assert await waiter is payload and not payload.released
        rooms.close("room-1", KEY)
        assert len(rooms) == 0 and rooms.link_of("room-1") is None and rooms.recent_key("room-1") == KEY
        late = _Payload("room-1")
        rooms.resolve("room-1", late, None)  # nobody waits for it any more
        assert late.released

    run(go())


def test_prefills_failure_and_a_lost_link_fail_only_their_own_rooms() -> None:
    async def go() -> None:
        rooms = _decode_rooms()
        for room, link in (("room-1", 1), ("room-2", 1), ("room-3", 2)):
            rooms.open(room, link)
        waits = {r: asyncio.ensure_future(rooms.wait(r)) for r in ("room-1", "room-2", "room-3")}
        await asyncio.sleep(0)
        rooms.on_message(2, PdDone(req_id="room-1", error="not yours"))  # another link's word changes nothing
        rooms.on_message(1, PdDone(req_id="room-1", error="prompts differ", status=400))
        with pytest.raises(RoomFailure, match="prefill failed: prompts differ") as err:
            await waits["room-1"]
        assert err.value.status == 400
        rooms.fail_link(1, "prefill stopped answering")
        with pytest.raises(RoomFailure, match="room-2: prefill stopped answering"):
            await waits["room-2"]
        assert not waits["room-3"].done()
        rooms.resolve("room-3", _Payload("room-3"), None)
        assert (await waits["room-3"]).room == "room-3"

    run(go())


def test_the_wait_is_measured_by_prefills_liveness() -> None:
    async def go() -> None:
        rooms = _decode_rooms(timeout_s=0.4)
        rooms.open("room-1", 1)
        with pytest.raises(RoomFailure, match="did not acknowledge the claim") as err:
            await rooms.wait("room-1")  # no word from prefill at all: a server fault
        assert err.value.status is None
        rooms.close("room-1", None)
        rooms.open("room-2", 1)
        rooms.open("room-3", 1)
        rooms.on_message(1, PdProgress(req_id="room-2", stage="queued"))
        t0 = time.monotonic()
        waiter = asyncio.ensure_future(rooms.wait("room-2"))
        for _ in range(4):  # prefill keeps working on another room of the same link: room-2 keeps waiting
            await asyncio.sleep(0.2)
            rooms.on_message(1, PdProgress(req_id="room-3", stage="started"))
        assert not waiter.done()
        with pytest.raises(RoomFailure, match="prefill never received this request") as err:
            await waiter  # queued and nothing more: the router's request never reached prefill
        assert err.value.status == 408 and time.monotonic() - t0 >= 0.8

    run(go())
