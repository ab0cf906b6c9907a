"""The PD handshake: prefill's bootstrap endpoint and decode's `register()` client.

Prefill runs a `BootstrapServer` (a ZMQ ROUTER on `tcp://127.0.0.1:bootstrap_port`, in its own
thread). Decode calls `register(endpoint, info)`:

    decode                                   prefill
    Hello(client_nonce)             ->
                                    <-       Challenge(nonce, auth_required, server_epoch)
    Register(info_bytes, nonce, proof)  ->   compare(prefill, decode) -> every mismatch
                                    <-       Accepted(prefill info, session, proof) | Rejected(reason, mismatches)

With a shared secret, decode proves it with HMAC-SHA256(secret, nonce || info_bytes) over the
server's one-time nonce (so a proof cannot be replayed, and it binds the registration it came with),
and prefill proves it back over decode's nonce; a side that cannot prove it is refused. Without a
secret on prefill, proofs are not required.

Every accepted registration is its own pairing (a session): several decodes pair with one prefill, and
a second registration never displaces a live one (no "latest wins": a process that registers while a
pair is serving gets a session of its own and nothing of anyone else's). A session lives while its
decode pings it (`ping(endpoint, session)`, every second); one not pinged for `peer_ttl_s` is dropped
(`on_unpair`), so a decode that restarted simply registers again and its old session expires. Pings also
let decode notice that prefill restarted (a new `server_epoch`, or an unknown session) and re-register.

With a shared secret, each session also gets a per-session key, HMAC(secret, "specctl-session" ||
server nonce || client nonce), known to exactly the two peers: the session's seals (`Peer.control`,
`Pairing.control`, and the transfer channel's, wire.Seal) put a per-session counter and an HMAC on every control
message and payload of that session (pd/messages), and every ping carries the counter in its proof, so no socket of
the PD plane acts on a message that fails authentication or replays one already seen (stale ones are counted).

A rejection never carries prefill's registration (it would tell a stranger what to claim): without a shared
secret it names the differing fields and the peer's own values, never prefill's. Each round trip is a Lazy
Pirate request (timeout, bounded retries, fresh socket per attempt), so a missing prefill is a clear error,
never a hang.
"""

from __future__ import annotations

import hashlib
import hmac
import logging
import os
import threading
import time
import uuid
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import msgspec
import zmq

from specctl.engine.pd import wire
from specctl.engine.pd.registration import RegistrationInfo, compare, render_mismatches, withheld
from specctl.engine.pd.transfer import transfer_seal
from specctl.errors import RuntimeFailure
from specctl.schemas.pd_agreement import Difference

log = logging.getLogger("specctl.bootstrap")

_NONCE_TTL_S = 30.0
_MAX_NONCES = 1024
MAX_SESSIONS = 64  # live sessions (paired decodes) one prefill serves; a registration beyond is refused


class Hello(wire.Message, tag="bootstrap.hello", frozen=True):
    client_nonce: bytes


class Challenge(wire.Message, tag="bootstrap.challenge", frozen=True):
    nonce: bytes
    auth_required: bool
    server_epoch: str


class Register(wire.Message, tag="bootstrap.register", frozen=True):
    info: bytes  # msgpack of RegistrationInfo; the proof is computed over exactly these bytes
    nonce: bytes
    client_nonce: bytes
    proof: bytes = b""


class Accepted(wire.Message, tag="bootstrap.accepted", frozen=True):
    prefill: RegistrationInfo
    session_id: str
    server_epoch: str
    proof: bytes = b""


class Rejected(wire.Message, tag="bootstrap.rejected", frozen=True):
    reason: str
    mismatches: list[Difference] = []
    prefill: RegistrationInfo | None = None


class Ping(wire.Message, tag="bootstrap.ping", frozen=True):
    session_id: str
    nonce: bytes = b""  # fresh per ping; with a secret `proof` = HMAC(session key, "ping" || id || nonce || counter)
    proof: bytes = b""
    counter: int = 0  # the session's control counter (Seal.next_counter): a replayed ping is stale


class Pong(wire.Message, tag="bootstrap.pong", frozen=True):
    paired: bool
    server_epoch: str


class HandshakeRejected(RuntimeFailure):
    """Prefill refused this decode: `.mismatches` itemizes why (may be empty for auth/protocol)."""

    def __init__(self, reason: str, mismatches: list[Difference] | None = None) -> None:
        self.reason = reason
        self.mismatches = list(mismatches or [])
        text = f"handshake refused by prefill: {reason}"
        if self.mismatches:
            text += "\n" + render_mismatches(self.mismatches)
        super().__init__(text, hint="fix the fields above so prefill and decode agree, then restart decode")

    def to_json(self) -> dict[str, Any]:
        return {"reason": self.reason, "mismatches": [m.to_json() for m in self.mismatches]}


_info_encoder = msgspec.msgpack.Encoder()
_info_decoder = msgspec.msgpack.Decoder(RegistrationInfo)


def _as_key(secret: bytes | str | None) -> bytes | None:
    if secret is None or secret == "" or secret == b"":
        return None
    return secret.encode() if isinstance(secret, str) else bytes(secret)


def _proof(key: bytes, nonce: bytes, payload: bytes) -> bytes:
    return hmac.new(key, nonce + payload, hashlib.sha256).digest()


def bootstrap_endpoint(host: str, port: int) -> str:
    return f"tcp://{host}:{port}"


@dataclass
class Peer:
    """One decode paired with this prefill (one session)."""

    info: RegistrationInfo
    session_id: str
    generation: int  # 1 for the first pairing, +1 for every later one
    paired_at: float
    key: bytes | None = None  # the session's message key (shared secret only)
    last_seen: float = field(default_factory=time.monotonic)
    # The session's sealed channels as prefill sees them (counter + MAC; pass-through without a key).
    control: wire.Seal = field(init=False)
    transfer: wire.Seal = field(init=False)
    ping_high: int = 0  # the highest ping counter seen: a ping at or below it is a replay

    def __post_init__(self) -> None:
        self.control = control_seal(self.key, "prefill")
        self.transfer = transfer_seal(self.key, "prefill")


def _ping_proof(key: bytes, session_id: str, nonce: bytes, counter: int = 0) -> bytes:
    msg = b"ping\0" + session_id.encode() + b"\0" + nonce + b"\0" + counter.to_bytes(8, "little")
    return hmac.new(key, msg, hashlib.sha256).digest()


def control_seal(key: bytes | None, side: str) -> wire.Seal:
    """The control channel's seal of a session as `side` ("prefill" or "decode") sees it."""
    other = "decode" if side == "prefill" else "prefill"
    return wire.Seal(key, send=f"{side}/control", recv=f"{other}/control")


def session_key(key: bytes | None, server_nonce: bytes, client_nonce: bytes) -> bytes | None:
    if key is None:
        return None
    return hmac.new(key, b"specctl-session\0" + server_nonce + client_nonce, hashlib.sha256).digest()


def seal(key: bytes | None, frames: list[bytes]) -> list[bytes]:
    """`frames` + one MAC frame over all of them (nothing is added without a key). Stateless: no counter, so
    nothing the serving path sends; the sessions' channels use `Peer.control` / `Pairing.control`."""
    if key is None:
        return frames
    return [*frames, wire.mac_of(key, frames)]


def open_sealed(key: bytes | None, frames: list[bytes]) -> list[bytes] | None:
    """The frames without their MAC, or None when the MAC is missing or wrong (keyless: as they came)."""
    if key is None:
        return frames
    return wire.strip_mac(key, frames)


@dataclass
class BootstrapStats:
    accepted: int = 0
    rejected: int = 0
    last_rejection: list[dict[str, Any]] = field(default_factory=list)
    last_reason: str = ""
    rejected_by: dict[str, int] = field(default_factory=dict)  # refusals by kind (a metric)

    def count(self, kind: str) -> None:
        self.rejected_by[kind] = self.rejected_by.get(kind, 0) + 1


class BootstrapServer:
    """Prefill's bootstrap endpoint. Use as a context manager, or start()/stop()."""

    def __init__(
        self,
        local: RegistrationInfo,
        *,
        host: str = "127.0.0.1",
        port: int = 0,
        secret: bytes | str | None = None,
        on_pair: Callable[[Peer], None] | None = None,
        on_unpair: Callable[[Peer], None] | None = None,
        peer_ttl_s: float = 10.0,
        ctx: zmq.Context[Any] | None = None,
        max_sessions: int = MAX_SESSIONS,
    ) -> None:
        self.local = local
        self.max_sessions = max_sessions
        self._host, self._port = host, port
        self._key = _as_key(secret)
        self._on_pair = on_pair
        self._on_unpair = on_unpair
        self.peer_ttl_s = peer_ttl_s
        self._ctx = ctx or zmq.Context.instance()
        self._local_bytes = _info_encoder.encode(local)
        self.server_epoch = uuid.uuid4().hex
        self._nonces: OrderedDict[bytes, float] = OrderedDict()
        self._peers: dict[str, Peer] = {}
        self._generation = 0
        self._cond = threading.Condition()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._ready = threading.Event()
        self._error: BaseException | None = None
        self.endpoint = ""
        self.stats = BootstrapStats()

    # ------------------------------------------------------------------ lifecycle
    def start(self) -> BootstrapServer:
        self._thread = threading.Thread(target=self._run, name="specctl-bootstrap", daemon=True)
        self._thread.start()
        self._ready.wait(10.0)
        if self._error is not None:
            raise self._error
        if not self.endpoint:
            raise RuntimeFailure("bootstrap server did not start within 10s")
        return self

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(5.0)

    def __enter__(self) -> BootstrapServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    @property
    def port(self) -> int:
        return int(self.endpoint.rsplit(":", 1)[1])

    @property
    def auth_required(self) -> bool:
        return self._key is not None

    @property
    def peer(self) -> Peer | None:
        """The most recent live pairing (inspection only: requests find theirs by session, `peer_for`)."""
        peers = self.peers
        return max(peers, key=lambda p: p.generation) if peers else None

    @property
    def peers(self) -> list[Peer]:
        self._expire()
        with self._cond:
            return list(self._peers.values())

    def peer_for(self, session_id: str) -> Peer | None:
        """The live pairing of `session_id`, or None."""
        self._expire()
        with self._cond:
            return self._peers.get(session_id)

    def wait_for_peer(self, timeout_s: float, *, after_generation: int = 0) -> Peer | None:
        """The newest pairing once one with generation > after_generation registered, else None."""
        deadline = time.monotonic() + timeout_s
        with self._cond:
            while True:
                newest = max(self._peers.values(), key=lambda p: p.generation, default=None)
                if newest is not None and newest.generation > after_generation:
                    return newest
                left = deadline - time.monotonic()
                if left <= 0:
                    return None
                self._cond.wait(left)

    def _expire(self) -> None:
        now = time.monotonic()
        with self._cond:
            gone = [p for p in self._peers.values() if now - p.last_seen > self.peer_ttl_s]
            for p in gone:
                del self._peers[p.session_id]
        for p in gone:
            self._unpaired(p)

    def _unpaired(self, peer: Peer) -> None:
        if self._on_unpair is not None:
            try:
                self._on_unpair(peer)
            except Exception:  # a callback bug must not stop the bootstrap thread
                pass

    # ------------------------------------------------------------------ loop
    def _run(self) -> None:
        sock = wire.make_socket(self._ctx, zmq.ROUTER)
        try:
            try:
                self.endpoint = wire.bind(sock, bootstrap_endpoint(self._host, self._port))
            except BaseException as exc:  # reported to start()
                self._error = exc
                return
            finally:
                self._ready.set()
            while not self._stop.is_set():
                if not sock.poll(100, zmq.POLLIN):
                    continue
                frames = sock.recv_multipart(copy=False)
                identity = frames[0].bytes
                try:
                    env = wire.decode(frames[1:], as_torch=False)
                    reply = self._handle(env.msg)
                except wire.WireError as exc:
                    self.stats.count("malformed")
                    reply = Rejected(reason=f"malformed handshake message: {exc}")
                except Exception as exc:  # a bug in a check must not kill the thread: prefill could never pair again
                    log.warning("bootstrap: refused a message it could not handle (%s: %s)", type(exc).__name__, exc)
                    reply = Rejected(reason="the bootstrap could not handle this message (see prefill's log)")
                if reply is not None:
                    try:
                        wire.send(sock, reply, timeout_s=0.2, identity=identity)
                    except wire.WireError:
                        pass  # the client gave up (its retry comes on a fresh socket)
        finally:
            wire.close_socket(sock)

    def _new_nonce(self) -> bytes:
        now = time.monotonic()
        while self._nonces and (len(self._nonces) >= _MAX_NONCES or next(iter(self._nonces.values())) < now):
            self._nonces.popitem(last=False)
        nonce = os.urandom(32)
        self._nonces[nonce] = now + _NONCE_TTL_S
        return nonce

    def _handle(self, msg: wire.Message) -> wire.Message | None:
        if isinstance(msg, Hello):
            return Challenge(
                nonce=self._new_nonce(), auth_required=self._key is not None, server_epoch=self.server_epoch
            )
        if isinstance(msg, Ping):
            # A ping keeps its session alive; knowing a session id is what a ping proves (ids are random
            # 128-bit values only the paired decode learned), and a ping grants nothing else.
            peer = self.peer_for(msg.session_id)
            if peer is not None and peer.key is not None:
                if not hmac.compare_digest(msg.proof, _ping_proof(peer.key, msg.session_id, msg.nonce, msg.counter)):
                    self.stats.count("auth")
                    return Pong(paired=False, server_epoch=self.server_epoch)  # unauthenticated: keeps nothing alive
                if msg.counter <= peer.ping_high:  # a replayed ping: answered, but it keeps nothing alive
                    self.stats.count("stale")
                    return Pong(paired=True, server_epoch=self.server_epoch)
                peer.ping_high = msg.counter
            if peer is not None:
                peer.last_seen = time.monotonic()
            return Pong(paired=peer is not None, server_epoch=self.server_epoch)
        if isinstance(msg, Register):
            return self._register(msg)
        return Rejected(reason=f"unexpected message {type(msg).__name__} on the bootstrap endpoint")

    def _reject(self, reason: str, mismatches: list[Difference] | None = None, *, kind: str = "registration"
                ) -> Rejected:
        self.stats.rejected += 1
        self.stats.count(kind)
        self.stats.last_reason = reason
        self.stats.last_rejection = [m.to_json() for m in mismatches or []]
        # No `prefill=` registration in a rejection: a stranger must not learn what to claim.
        return Rejected(reason=reason, mismatches=list(mismatches or []))

    def _register(self, msg: Register) -> wire.Message:
        expiry = self._nonces.pop(msg.nonce, None)  # one-time: a replayed Register finds no nonce
        if expiry is None or expiry < time.monotonic():
            return self._reject("unknown or expired handshake nonce (retry the handshake)", kind="nonce")
        if self._key is not None and not hmac.compare_digest(msg.proof, _proof(self._key, msg.nonce, msg.info)):
            return self._reject("authentication failed: decode could not prove the shared secret", kind="auth")
        try:
            info = _info_decoder.decode(msg.info)
        except (msgspec.DecodeError, msgspec.ValidationError) as exc:
            return self._reject(f"malformed registration info: {exc}", kind="malformed")
        mismatches = compare(self.local, info)
        if mismatches:
            # Only a peer that proved the shared secret learns prefill's values; any other learns the fields.
            shown = mismatches if self._key is not None else withheld(mismatches)
            return self._reject(f"{len(mismatches)} field(s) differ between prefill and decode", shown)
        self._expire()
        with self._cond:
            full = len(self._peers) >= self.max_sessions
        if full:
            return self._reject(f"prefill already serves {self.max_sessions} sessions, the most it holds; sessions "
                                "of decodes that stopped pinging expire within peer_ttl_s (retry then)",
                                kind="sessions")
        with self._cond:
            self._generation += 1
            peer = Peer(info=info, session_id=uuid.uuid4().hex, generation=self._generation, paired_at=time.time(),
                        key=session_key(self._key, msg.nonce, msg.client_nonce))
        if self._on_pair is not None:
            try:
                self._on_pair(peer)
            except Exception as exc:  # e.g. prefill cannot reach decode's transfer endpoint
                return self._reject(f"prefill could not set up the transfer to decode: {exc}")
        with self._cond:
            self._peers[peer.session_id] = peer
            self._cond.notify_all()
        self.stats.accepted += 1
        proof = _proof(self._key, msg.client_nonce, self._local_bytes) if self._key is not None else b""
        return Accepted(prefill=self.local, session_id=peer.session_id, server_epoch=self.server_epoch, proof=proof)


# --------------------------------------------------------------------------------------------- client


@dataclass(frozen=True)
class Pairing:
    """A successful handshake, as seen by decode."""

    endpoint: str
    prefill: RegistrationInfo
    session_id: str
    server_epoch: str
    latency_s: float
    key: bytes | None = None  # the session's message key (shared secret only)
    # The session's sealed channels as decode sees them (counter + MAC; pass-through without a key).
    control: wire.Seal = field(init=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "control", control_seal(self.key, "decode"))


def register(
    endpoint: str,
    local: RegistrationInfo,
    *,
    secret: bytes | str | None = None,
    timeout_s: float = 5.0,
    retries: int = 3,
    ctx: zmq.Context[Any] | None = None,
) -> Pairing:
    """Register decode `local` with prefill's bootstrap `endpoint`.

    Returns the Pairing, or raises HandshakeRejected (with every mismatch) or wire.WireTimeout
    (no prefill answering after `retries` attempts of `timeout_s`).
    """
    ctx = ctx or zmq.Context.instance()
    key = _as_key(secret)
    t0 = time.perf_counter()
    client_nonce = os.urandom(32)
    info_bytes = _info_encoder.encode(local)
    what = f"answer from prefill's bootstrap endpoint {endpoint}"
    for _ in range(3):  # an expired nonce (slow retry) restarts from Hello
        env = wire.request(
            ctx,
            endpoint,
            Hello(client_nonce=client_nonce),
            timeout_s=timeout_s,
            retries=retries,
            expect=(Challenge, Rejected),
            what=what,
        )
        ch = env.msg
        if isinstance(ch, Rejected):
            raise HandshakeRejected(ch.reason, ch.mismatches)
        assert isinstance(ch, Challenge)
        if ch.auth_required and key is None:
            raise HandshakeRejected(
                "authentication required: prefill has a shared secret and decode has none "
                "(set the same transfer secret on both roles)"
            )
        proof = _proof(key, ch.nonce, info_bytes) if key is not None else b""
        reg = Register(info=info_bytes, nonce=ch.nonce, client_nonce=client_nonce, proof=proof)
        # One attempt only: a resent Register would reuse a consumed nonce; the loop restarts instead.
        env = wire.request(ctx, endpoint, reg, timeout_s=timeout_s, retries=1, expect=(Accepted, Rejected), what=what)
        verdict = env.msg
        if isinstance(verdict, Rejected):
            if "nonce" in verdict.reason:
                continue
            raise HandshakeRejected(verdict.reason, verdict.mismatches)
        assert isinstance(verdict, Accepted)
        if key is not None:
            expected = _proof(key, client_nonce, _info_encoder.encode(verdict.prefill))
            if not hmac.compare_digest(verdict.proof, expected):
                raise HandshakeRejected("authentication failed: prefill could not prove the shared secret")
        return Pairing(
            endpoint=endpoint,
            prefill=verdict.prefill,
            session_id=verdict.session_id,
            server_epoch=verdict.server_epoch,
            latency_s=time.perf_counter() - t0,
            key=session_key(key, ch.nonce, client_nonce),
        )
    raise HandshakeRejected("handshake nonce kept expiring (is prefill's clock or load extreme?)")


def _ping(pairing: Pairing) -> Ping:
    if pairing.key is None:
        return Ping(session_id=pairing.session_id)
    nonce = os.urandom(16)
    counter = pairing.control.next_counter()
    return Ping(session_id=pairing.session_id, nonce=nonce, counter=counter,
                proof=_ping_proof(pairing.key, pairing.session_id, nonce, counter))


def ping(pairing: Pairing, *, timeout_s: float = 2.0, retries: int = 1, ctx: zmq.Context[Any] | None = None) -> bool:
    """True while prefill is up and still paired with this session. False when prefill restarted
    (new epoch) or dropped the pairing: decode should `register()` again. Raises wire.WireTimeout
    when prefill does not answer."""
    env = wire.request(
        ctx or zmq.Context.instance(),
        pairing.endpoint,
        _ping(pairing),
        timeout_s=timeout_s,
        retries=retries,
        expect=(Pong,),
        what="pong from prefill",
    )
    pong = env.msg
    assert isinstance(pong, Pong)
    return pong.paired and pong.server_epoch == pairing.server_epoch
