"""The wire: typed, versioned ZeroMQ messages with raw zero-copy tensor frames. No pickle.

A message on the wire is a multipart ZeroMQ message:

    [identity]            only on ROUTER sockets (added/stripped by the helpers below)
    header                msgpack (msgspec) array: [MAGIC, PROTOCOL_VERSION, type tag, body, tensor metas]
    tensor 0 .. n-1       raw bytes of each tensor, C-contiguous, in the order of the metas

The body is a `Message` subclass (a msgspec Struct with a `tag`); each tensor meta carries its name,
dtype name (torch spelling: "float32", "bfloat16", ...) and shape, so the receiver rebuilds the tensor
as a view of the received frame without copying. A peer speaking another protocol version, or sending
a type this side does not know, gets a `WireError` that says so instead of a decode error deep inside.

Socket discipline (zguide "Lazy Pirate"): every receive polls with a timeout (`WireTimeout`), every
send waits for writability at most a timeout (a peer that vanished never blocks us), sockets close
with LINGER 0, and request/reply clients retry a bounded number of times on a fresh socket. Frames
under 64 KiB are copied on send (cheaper than zero-copy bookkeeping); larger ones are not.
"""

from __future__ import annotations

import dataclasses
import hashlib
import hmac
import math
import threading
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, cast

import msgspec
import numpy as np
import zmq

from specctl.errors import RuntimeFailure

MAGIC = "specctl"
PROTOCOL_VERSION = 2  # raised with every change of a message's fields: peers of two versions never pair

# Plain ints: enum arithmetic on every send is measurable on the hot path.
_NOBLOCK, _SNDMORE, _POLLIN = int(zmq.NOBLOCK), int(zmq.SNDMORE), int(zmq.POLLIN)
_COPY_BELOW = 65536
MAX_TENSOR_DIMS = 8
# The largest frame a control socket accepts (ZMQ_MAXMSGSIZE: a peer sending more is disconnected before
# the frame is buffered). Transfer receivers set their own bound from the registration.
MAX_CONTROL_BYTES = 1 << 20

# dtype name -> (numpy dtype used to view the bytes, item size). bfloat16 has no numpy dtype: its
# bytes travel as uint16 and are reinterpreted by torch on the receiving side.
_DTYPES: dict[str, tuple[str, int]] = {
    "float32": ("float32", 4),
    "float16": ("float16", 2),
    "bfloat16": ("uint16", 2),
    "float64": ("float64", 8),
    "int64": ("int64", 8),
    "int32": ("int32", 4),
    "int16": ("int16", 2),
    "int8": ("int8", 1),
    "uint8": ("uint8", 1),
    "bool": ("bool", 1),
}


class WireError(RuntimeFailure):
    """A malformed, foreign or unexpected message, or a socket that cannot be used."""


class WireTimeout(WireError):
    """No message (or no chance to send one) within the timeout."""


class Message(msgspec.Struct, frozen=True, tag=True, kw_only=True):
    """Base of every wire message. Subclasses are tagged with their class name (or `tag=...`)."""

    @staticmethod
    def lookup(tag: str) -> type[Message] | None:
        """The message class with this tag (subclasses register by existing; looked up lazily)."""
        cls = _registry.get(tag)
        if cls is None:
            stack = list(Message.__subclasses__())
            while stack:
                c = stack.pop()
                stack.extend(c.__subclasses__())
                _registry.setdefault(str(c.__struct_config__.tag), c)
            cls = _registry.get(tag)
        return cls


_registry: dict[str, type[Message]] = {}


class TensorMeta(msgspec.Struct, frozen=True, array_like=True):
    """dtype/shape of one raw tensor frame."""

    name: str
    dtype: str
    shape: tuple[int, ...]

    @property
    def nbytes(self) -> int:
        return math.prod(self.shape) * dtype_itemsize(self.dtype)


def check_meta(meta: TensorMeta, what: str = "message") -> None:
    """WireError unless `meta` is a tensor this side can build: a known dtype, at most MAX_TENSOR_DIMS
    dimensions, none negative (a peer's shape is never trusted)."""
    if len(meta.shape) > MAX_TENSOR_DIMS or any(d < 0 for d in meta.shape):
        raise WireError(f"{what!r} tensor {meta.name!r}: invalid shape {list(meta.shape)} (at most "
                        f"{MAX_TENSOR_DIMS} dimensions, none negative)")
    dtype_itemsize(meta.dtype)


def dtype_itemsize(name: str) -> int:
    try:
        return _DTYPES[name][1]
    except KeyError:
        raise WireError(f"unsupported tensor dtype {name!r}", hint=f"supported: {', '.join(_DTYPES)}") from None


# --------------------------------------------------------------------------------------------- tensors


def _is_torch(x: Any) -> bool:
    return type(x).__module__.startswith("torch")


def tensor_nbytes(x: Any) -> int:
    """Bytes of a torch tensor's or numpy array's data."""
    if _is_torch(x):
        return int(x.numel() * x.element_size())
    return int(np.asarray(x).nbytes)


def tensor_buffer(x: Any) -> tuple[str, tuple[int, ...], memoryview]:
    """(dtype name, shape, raw byte view) of a torch tensor or numpy array, without copying when it
    is already C-contiguous on the CPU (otherwise one contiguous CPU copy is made)."""
    if _is_torch(x):
        import torch  # noqa: PLC0415 - torch: the engine extra; the torch-free install and `specctl validate` never load it

        dtype = str(x.dtype).removeprefix("torch.")
        t = x.detach()
        if t.device.type != "cpu":
            t = t.cpu()
        t = t.contiguous()
        # View as bytes through uint8 so bfloat16 (no numpy dtype) travels too.
        flat = t.reshape(-1).view(torch.uint8) if t.numel() else torch.empty(0, dtype=torch.uint8)
        return dtype, tuple(t.shape), flat.numpy().data.cast("B")
    arr = np.ascontiguousarray(x)
    dtype = str(arr.dtype)
    if dtype not in _DTYPES:
        raise WireError(f"unsupported tensor dtype {dtype!r}", hint=f"supported: {', '.join(_DTYPES)}")
    return dtype, tuple(arr.shape), arr.reshape(-1).view(np.uint8).data.cast("B")


def buffer_tensor(buf: Any, meta: TensorMeta, *, as_torch: bool = True, offset: int = 0) -> Any:
    """A tensor (torch, or numpy when as_torch=False) viewing `buf[offset:offset+meta.nbytes]` without
    copying. The caller keeps `buf` alive as long as the tensor (zero-copy: the memory is the frame's
    or the shared segment's)."""
    np_dtype, _ = _DTYPES.get(meta.dtype, (None, 0))
    if np_dtype is None:
        raise WireError(f"tensor {meta.name!r}: unsupported dtype {meta.dtype!r}")
    count = math.prod(meta.shape)
    arr = np.frombuffer(buf, dtype=np_dtype, count=count, offset=offset).reshape(meta.shape)
    if not as_torch:
        return arr
    import torch  # noqa: PLC0415 - torch: the engine extra; the torch-free install and `specctl validate` never load it

    t = torch.from_numpy(arr)
    if meta.dtype == "bfloat16":
        t = t.view(torch.bfloat16)
    return t


# --------------------------------------------------------------------------------------------- codec


@dataclass(frozen=True)
class Envelope:
    """One decoded message: the typed body, its named tensors (zero-copy views), and the ROUTER
    identity of the sender when received on a ROUTER socket."""

    msg: Message
    tensors: dict[str, Any] = field(default_factory=dict)
    identity: bytes | None = None
    frames: tuple[Any, ...] = ()  # keeps the received zmq frames (the tensors' memory) alive
    metas: tuple[TensorMeta, ...] = ()


_encoder = msgspec.msgpack.Encoder()
_outer = msgspec.msgpack.Decoder(tuple[str, int, str, msgspec.Raw, msgspec.Raw])
_metas = msgspec.msgpack.Decoder(list[TensorMeta])
_body_decoders: dict[str, msgspec.msgpack.Decoder[Any]] = {}


def encode(msg: Message, tensors: Mapping[str, Any] | None = None) -> list[Any]:
    """Frames for `msg` and its tensors: [header, raw0, raw1, ...] (raw frames are views, not copies)."""
    metas: list[TensorMeta] = []
    raws: list[memoryview] = []
    for name, t in (tensors or {}).items():
        dtype, shape, raw = tensor_buffer(t)
        metas.append(TensorMeta(name, dtype, shape))
        raws.append(raw)
    tag = type(msg).__struct_config__.tag
    header = _encoder.encode((MAGIC, PROTOCOL_VERSION, tag, msg, metas))
    return [header, *raws]


def decode(frames: Sequence[Any], *, as_torch: bool = True, expect: tuple[type[Message], ...] = ()) -> Envelope:
    """Decode [header, raw...] frames (zmq.Frame or bytes). WireError names what is wrong."""
    if not frames:
        raise WireError("empty message")
    head = frames[0].bytes if isinstance(frames[0], zmq.Frame) else bytes(frames[0])
    try:
        magic, version, tag, body, metas_raw = _outer.decode(head)
    except (msgspec.DecodeError, RecursionError, ValueError, TypeError) as exc:
        raise WireError(f"not a specctl message header ({type(exc).__name__}: {exc})") from None
    if magic != MAGIC:
        raise WireError(f"not a specctl message (magic {magic!r})")
    if version != PROTOCOL_VERSION:
        raise WireError(
            f"peer speaks wire protocol v{version}, this process v{PROTOCOL_VERSION}",
            hint="run the same specctl version on every process of the deployment",
        )
    cls = Message.lookup(tag)
    if cls is None:
        raise WireError(f"unknown message type {tag!r}")
    if expect and cls not in expect:
        names = ", ".join(str(c.__struct_config__.tag) for c in expect)
        raise WireError(f"unexpected message type {tag!r} (expected {names})")
    dec = _body_decoders.get(tag)
    if dec is None:
        dec = _body_decoders[tag] = msgspec.msgpack.Decoder(cls)
    try:
        msg = dec.decode(body)
        metas = _metas.decode(metas_raw)
    except (msgspec.DecodeError, msgspec.ValidationError) as exc:
        raise WireError(f"malformed {tag!r} message: {exc}") from None
    except (RecursionError, ValueError, TypeError, OverflowError) as exc:  # e.g. msgpack nested past the stack
        raise WireError(f"malformed {tag!r} message ({type(exc).__name__}: {exc})") from None
    for meta in metas:
        check_meta(meta, tag)
    raws = frames[1:]
    if len(raws) != len(metas):
        raise WireError(f"{tag!r} message declares {len(metas)} tensors but carries {len(raws)} frames")
    tensors: dict[str, Any] = {}
    for meta, raw in zip(metas, raws, strict=True):
        buf = raw.buffer if isinstance(raw, zmq.Frame) else raw
        size = memoryview(buf).nbytes
        if size != meta.nbytes:
            raise WireError(
                f"{tag!r} tensor {meta.name!r}: frame has {size} bytes but dtype {meta.dtype} shape "
                f"{list(meta.shape)} needs {meta.nbytes}"
            )
        try:
            tensors[meta.name] = buffer_tensor(buf, meta, as_torch=as_torch)
        except (ValueError, TypeError) as exc:
            raise WireError(f"{tag!r} tensor {meta.name!r}: {exc}") from None
    return Envelope(msg=msg, tensors=tensors, frames=tuple(frames), metas=tuple(metas))


# --------------------------------------------------------------------------------------------- sockets


def make_socket(ctx: zmq.Context[Any], kind: int, *, hwm: int = 1000,
                max_message_bytes: int = MAX_CONTROL_BYTES) -> zmq.Socket[Any]:
    """A socket that never lingers on close, never blocks forever on a full queue, and disconnects a peer that
    sends a frame over `max_message_bytes` (ZMQ_MAXMSGSIZE) instead of buffering it."""
    sock: zmq.Socket[Any] = ctx.socket(kind)
    bound_socket(sock, max_message_bytes)
    sock.setsockopt(zmq.SNDHWM, hwm)
    sock.setsockopt(zmq.RCVHWM, hwm)
    if kind == zmq.ROUTER:
        # A reply to a vanished peer is an error, not a silent drop.
        sock.setsockopt(zmq.ROUTER_MANDATORY, 1)
    return sock


def bound_socket(sock: Any, max_message_bytes: int = MAX_CONTROL_BYTES) -> None:
    """LINGER 0 and ZMQ_MAXMSGSIZE on any socket (zmq or zmq.asyncio) this process makes."""
    sock.setsockopt(zmq.LINGER, 0)
    sock.setsockopt(zmq.MAXMSGSIZE, int(max_message_bytes))


def close_socket(sock: zmq.Socket[Any] | None) -> None:
    if sock is not None and not sock.closed:
        sock.close(linger=0)


def bind(sock: zmq.Socket[Any], endpoint: str) -> str:
    """Bind `endpoint` ("tcp://127.0.0.1:0" picks a free port) and return the concrete endpoint."""
    try:
        sock.bind(endpoint)
    except zmq.ZMQError as exc:
        raise WireError(f"cannot bind {endpoint}: {exc}", hint="choose another port or address") from None
    return sock.getsockopt_string(zmq.LAST_ENDPOINT)


def mac_of(key: bytes, frames: Sequence[Any]) -> bytes:
    """HMAC-SHA256 over frames (bytes, memoryviews or zmq.Frames), each length-prefixed so that frame
    boundaries are part of what is authenticated. Tensor frames are hashed in place, never copied."""
    mac = hmac.new(key, digestmod=hashlib.sha256)
    for f in frames:
        buf = f.buffer if isinstance(f, zmq.Frame) else f
        mac.update(memoryview(buf).nbytes.to_bytes(8, "little"))
        mac.update(buf)
    return mac.digest()


def strip_mac(key: bytes, frames: Sequence[Any]) -> list[Any] | None:
    """`frames` without their trailing MAC frame, or None when it is missing or wrong."""
    if len(frames) < 2:
        return None
    body, last = list(frames[:-1]), frames[-1]
    mac = last.bytes if isinstance(last, zmq.Frame) else bytes(last)
    return body if hmac.compare_digest(mac_of(key, body), mac) else None


class Seal:
    """One direction pair of a session's authenticated channel: `seal()` appends a counter frame and a MAC frame,
    `open()` checks both. The MAC (HMAC-SHA256 under the session key) covers the sender's direction label, every
    frame and the counter, so a message cannot be reflected back to its sender, altered, or replayed: each side
    numbers what it sends 1, 2, 3 ... and the receiver accepts a counter once, within a window of `WINDOW` below the
    highest it has seen (messages of one session may cross on several sockets). A stale counter is dropped and
    counted in `stale`, a bad MAC in `forged`. Without a key nothing is added or checked (an unauthenticated
    deployment). Thread-safe."""

    WINDOW = 4096

    def __init__(self, key: bytes | None, *, send: str, recv: str) -> None:
        self.key = key
        self._send_label = send.encode()
        self._recv_label = recv.encode()
        self._lock = threading.Lock()
        self._next = 0
        self._high = 0
        self._seen: set[int] = set()
        self.stale = 0
        self.forged = 0
        self.last_refusal = ""  # "stale" or "auth": why the latest open() returned None

    def next_counter(self) -> int:
        with self._lock:
            self._next += 1
            return self._next

    def seal(self, frames: Sequence[Any]) -> list[Any]:
        if self.key is None:
            return list(frames)
        counter = self.next_counter().to_bytes(8, "little")
        return [*frames, counter, mac_of(self.key, [self._send_label, *frames, counter])]

    def fresh(self, counter: int) -> bool:
        """Accept `counter` once (see the class docstring); False for a replayed or too old one."""
        with self._lock:
            if counter > self._high:
                self._seen.add(counter)
                self._high = counter
                if len(self._seen) > 2 * self.WINDOW:
                    self._seen = {c for c in self._seen if c > self._high - self.WINDOW}
                return True
            if counter <= self._high - self.WINDOW or counter in self._seen:
                return False
            self._seen.add(counter)
            return True

    def open(self, frames: Sequence[Any]) -> list[Any] | None:
        """The frames without counter and MAC, or None (forged or stale; `last_refusal` says which)."""
        if self.key is None:
            return list(frames)
        if len(frames) < 3:
            self.forged += 1
            self.last_refusal = "auth"
            return None
        body, counter, last = list(frames[:-2]), frames[-2], frames[-1]
        mac = last.bytes if isinstance(last, zmq.Frame) else bytes(last)
        raw = counter.bytes if isinstance(counter, zmq.Frame) else bytes(counter)
        if len(raw) != 8 or not hmac.compare_digest(mac_of(self.key, [self._recv_label, *body, raw]), mac):
            self.forged += 1
            self.last_refusal = "auth"
            return None
        if not self.fresh(int.from_bytes(raw, "little")):
            self.stale += 1
            self.last_refusal = "stale"
            return None
        return body


def send(
    sock: zmq.Socket[Any],
    msg: Message,
    tensors: Mapping[str, Any] | None = None,
    *,
    timeout_s: float,
    identity: bytes | None = None,
    mac_key: bytes | None = None,
    seal: Seal | None = None,
) -> None:
    """Send one message, waiting at most `timeout_s` for the socket to accept it. Tensor frames go
    zero-copy: their memory must not change until the peer acknowledges (callers wait for an ack).
    With `seal` the message is sealed (counter + MAC, `Seal.open` checks it); with `mac_key` a last frame
    carries the message's HMAC only (`mac_of`; one-off messages without a session)."""
    frames = encode(msg, tensors)
    if seal is not None:
        frames = seal.seal(frames)
    elif mac_key is not None:
        frames.append(mac_of(mac_key, frames))
    if identity is not None:
        frames.insert(0, identity)
    last = len(frames) - 1
    try:
        # The common case costs no poll: try the first frame without blocking, and wait for
        # writability only when the socket cannot take it. Once the first part of a multipart
        # message is accepted, ZeroMQ accepts the rest.
        for i, frame in enumerate(frames):
            flags = _NOBLOCK | (_SNDMORE if i < last else 0)
            # Small frames are copied (zero-copy bookkeeping costs more than the copy); large
            # tensor frames go without copying.
            copy = memoryview(frame).nbytes < _COPY_BELOW
            try:
                sock.send(frame, flags, copy=copy)
            except zmq.Again:
                if i or not sock.poll(max(0, int(timeout_s * 1000)), zmq.POLLOUT):
                    raise
                sock.send(frame, flags, copy=copy)
    except zmq.Again:
        raise WireTimeout(
            f"could not send {type(msg).__name__} within {timeout_s:g}s (peer gone, not connected, or queue full)"
        ) from None
    except zmq.ZMQError as exc:
        # ROUTER_MANDATORY: EHOSTUNREACH when the addressed peer is gone.
        raise WireError(f"could not send {type(msg).__name__}: {exc}") from None


def readable(sock: zmq.Socket[Any]) -> bool:
    """Whether a message is waiting, without a poll call (cheap on hot paths)."""
    return bool(cast(int, sock.getsockopt(zmq.EVENTS)) & _POLLIN)


def recv(
    sock: zmq.Socket[Any],
    *,
    timeout_s: float,
    as_torch: bool = True,
    expect: tuple[type[Message], ...] = (),
    what: str = "message",
) -> Envelope:
    """Receive one message within `timeout_s` (WireTimeout otherwise). On a ROUTER socket the
    identity frame is returned in `Envelope.identity`."""
    if not readable(sock) and (timeout_s <= 0 or not sock.poll(int(timeout_s * 1000), zmq.POLLIN)):
        raise WireTimeout(f"no {what} within {timeout_s:g}s")
    frames = sock.recv_multipart(copy=False)
    identity = None
    if sock.type == zmq.ROUTER:
        identity = frames[0].bytes
        frames = frames[1:]
    env = decode(frames, as_torch=as_torch, expect=expect)
    if identity is not None:
        env = dataclasses.replace(env, identity=identity)
    return env


def request(
    ctx: zmq.Context[Any],
    endpoint: str,
    msg: Message,
    *,
    timeout_s: float,
    retries: int = 3,
    expect: tuple[type[Message], ...] = (),
    what: str = "",
) -> Envelope:
    """Lazy Pirate request/reply: send on a fresh DEALER, wait `timeout_s` for the reply, and on
    silence close the socket (LINGER 0 drops the stale request) and retry, at most `retries` times."""
    what = what or f"reply from {endpoint}"
    for attempt in range(max(1, retries)):
        sock = make_socket(ctx, zmq.DEALER)
        try:
            sock.connect(endpoint)
            send(sock, msg, timeout_s=timeout_s)
            return recv(sock, timeout_s=timeout_s, expect=expect, what=what, as_torch=False)
        except WireTimeout:
            pass
        finally:
            close_socket(sock)
        if attempt + 1 < retries:
            time.sleep(min(0.05 * 2**attempt, 1.0))
    raise WireTimeout(
        f"no {what} after {max(1, retries)} attempt(s) of {timeout_s:g}s",
        hint="is the peer process running, and is the endpoint right?",
    )
