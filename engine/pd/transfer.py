"""KV + state transfer of one request from prefill to decode, checked against the registration.

A transfer is one request's payload: a header (request id, cached length, ordered component names, the
room's typed `PrefillResult`: first sampled token, random stream, draft length, timings) and named tensors
(KV buffers, each state component, the draft's KV). Prefill's `TransferSender` pushes it; decode's
`TransferReceiver` checks it against the `PayloadSpec` derived from the handshake's registration (component count,
names and order, dtypes, exact shapes and sizes) and acknowledges. A payload that does not
match fails *that request* — decode raises `TransferError(request_id, field)` and prefill's `send()`
raises the same error from the negative acknowledgement — never silent corruption.

Backends (`backend=`):
  zmq  header + raw tensor frames over a ZeroMQ DEALER -> ROUTER connection (tcp:// or ipc://),
       zero-copy on both ends (decode's tensors view the received frames).
  shm  same host only: prefill writes the tensors into a shared-memory segment (a file under
       /dev/shm, reused across requests) and ZeroMQ carries only the control message; decode's
       tensors view the segment. `Payload.release()` hands the segment back to prefill.

Authentication (shared secret): the sender is given its session's key (`key=`) and the receiver a lookup
`auth(request_id) -> key` (the key of the session that claimed that room). Every message then carries an
HMAC over all its frames, tensor bytes included (wire.mac_of), in both directions (payloads, acks, shm
releases); a message without a valid MAC, or for a room nobody claimed, is dropped without an answer and
counted in `auth_failures`: it is never acted on.

Every wait has a timeout, and prefill watches the connection: a decode that dies mid-transfer
makes `send()` raise within the timeout (at once when the socket sees the disconnect), and the
sender starts over on a fresh socket so no stale message reaches a restarted decode. Callers free
the request's pages on every error.

Tensors in a received `Payload` view transport memory: copy them (import_request does) before
`release()`. One sender or receiver is used from one thread at a time, except `Payload.release()`,
which may be called from any thread.

Component names and shapes (`PayloadSpec.from_registration`), the contract with
`ModelRunner.export_request()` (engine/cache.py); the sender puts them in this order
(`canonical_order`), decode checks names, count, order, dtypes and exact shapes:
  kv              [full layers, 2, pages, page_size, kv heads, head dim], model dtype; pages =
                  ceil(length / page_size); one page of one layer = kv_item_lens[i] bytes
  mamba_conv      [mamba layers, conv dim, d_conv - 1], model dtype      } state_types "mamba":
  mamba_ssm       [mamba layers, heads, head dim, d_state], float32       } state_dims = conv + ssm[1:]
  swa             state_dims of "swa" (the whole window), model dtype
  {state_type}    any other state component: one tensor of shape state_dims[j], state_item_lens[j] bytes
  draft.*         the same for the draft model, sized by `result.draft_length` (no result: length)
"""

from __future__ import annotations

import collections
import math
import mmap
import os
import re
import tempfile
import threading
import time
import uuid
import weakref
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import msgspec
import zmq
from zmq.utils.monitor import recv_monitor_message

from specctl.engine.pd import wire
from specctl.engine.pd.messages import PrefillResult
from specctl.engine.pd.registration import RegistrationInfo
from specctl.engine.pd.wire import TensorMeta
from specctl.errors import RuntimeFailure

BACKENDS = ("zmq", "shm")
UNBOUNDED_FRAME_BYTES = 1 << 31  # a receiver without a spec: the most one frame may carry
MAX_SESSION_SEALS = 256  # sessions whose transfer counters a receiver remembers
MAX_MAPPED_SEGMENTS = 16  # shm segments a receiver keeps mapped (each holds a descriptor while mapped)
_ALIGN = 64
_SEGMENT_RE = re.compile(r"^specctl-shm-[0-9]+-[0-9a-f]+-[0-9]+$")


class TransferError(RuntimeFailure):
    """A transfer of one request failed; `.request_id` and `.field` say which and where."""

    def __init__(self, message: str, *, request_id: str | None = None, field: str = "", hint: str = "") -> None:
        super().__init__(message, hint=hint)
        self.request_id = request_id
        self.field = field


class TransferTimeout(TransferError):
    """Nothing arrived (receiver) or no acknowledgement came (sender) within the timeout."""


# --------------------------------------------------------------------------------------------- messages


def transfer_seal(key: bytes | None, side: str) -> wire.Seal:
    """The transfer channel's seal of a session as `side` ("prefill" sends payloads, "decode" acks) sees it."""
    other = "decode" if side == "prefill" else "prefill"
    return wire.Seal(key, send=f"{side}/transfer", recv=f"{other}/transfer")



class TransferHeader(wire.Message, tag="transfer.payload", frozen=True):
    request_id: str
    length: int
    components: list[str]
    result: PrefillResult | None = None


class ShmPayload(wire.Message, tag="transfer.shm", frozen=True):
    request_id: str
    length: int
    components: list[str]
    segment: str
    metas: list[TensorMeta]
    offsets: list[int]
    result: PrefillResult | None = None


class TransferAck(wire.Message, tag="transfer.ack", frozen=True):
    request_id: str
    ok: bool
    error: str = ""
    field: str = ""
    released: list[str] = []  # shm segments handed back, piggybacked to save a message


class ShmRelease(wire.Message, tag="transfer.release", frozen=True):
    segment: str


# --------------------------------------------------------------------------------------------- spec

PAGES = -1  # placeholder in a ComponentSpec shape: the request's page count, ceil(length / page_size)
_GROUP_RANK = {"kv": 0, "mamba": 1, "swa": 2}  # model_facts.STATE_TYPE_ORDER, after the paged KV


def _group(name: str) -> tuple[int, int, str]:
    """Sort key of a tensor name: target before draft, then kv, mamba*, swa, anything else."""
    draft = name.startswith("draft.")
    base = name[len("draft.") :] if draft else name
    head = base.split("_", 1)[0].split(".", 1)[0]
    return (int(draft), _GROUP_RANK.get(head, len(_GROUP_RANK)), head)


def canonical_order(tensors: Mapping[str, Any]) -> dict[str, Any]:
    """The tensors in the order the receiver expects: kv, then state components in the fixed
    `state_types` order (mamba, swa), then the draft's; stable within a group."""
    return dict(sorted(tensors.items(), key=lambda kv: _group(kv[0])))


@dataclass(frozen=True)
class ComponentSpec:
    """What one named tensor of a payload must look like."""

    name: str
    dtype: str
    shape: tuple[int, ...] | None = None  # exact shape, PAGES standing for the page count; None = unchecked
    page_size: int | None = None  # set for paged components (their size grows with the length)
    page_bytes: int | None = None  # bytes per page (paged components)
    nbytes: int | None = None  # exact bytes (fixed-size components)
    draft: bool = False  # sized by the draft's cached length

    def expected_shape(self, length: int) -> tuple[int, ...] | None:
        if self.shape is None:
            return None
        pages = -(-length // self.page_size) if self.page_size else 0
        return tuple(pages if d == PAGES else d for d in self.shape)


def _paged_kv(name: str, dtype: str, page_size: int, kv_item_lens: Sequence[int], shapes: Mapping[str, int],
              draft: bool) -> list[ComponentSpec]:
    if not kv_item_lens:
        return []
    kvh, hd = shapes.get("num_key_value_heads"), shapes.get("head_dim")
    item = 2 * page_size * (kvh or 0) * (hd or 0) * wire.dtype_itemsize(dtype)
    shape = None
    if kvh and hd and all(int(n) == item for n in kv_item_lens):
        # [full layers, k|v, pages, page_size, kv heads, head dim]: one page of one layer = kv_item_len
        shape = (len(kv_item_lens), 2, PAGES, page_size, kvh, hd)
    return [ComponentSpec(name, dtype, shape, page_size, sum(int(n) for n in kv_item_lens), draft=draft)]


def _states(prefix: str, dtype: str, types: Sequence[str], lens: Sequence[int], dims: Sequence[Sequence[int]],
            draft: bool) -> list[ComponentSpec]:
    out: list[ComponentSpec] = []
    for j, t in enumerate(types):
        item = int(lens[j]) if j < len(lens) else None
        d = tuple(int(x) for x in dims[j]) if j < len(dims) else ()
        if t == "mamba" and len(d) == 6:
            # the runner's mamba state: conv [layers, conv_dim, d_conv-1] in the model dtype and ssm
            # [layers, heads, head_dim, d_state] kept in float32; state_dims = conv dims + ssm dims[1:]
            conv, ssm = d[:3], (d[0], *d[3:])
            conv_b, ssm_b = math.prod(conv) * wire.dtype_itemsize(dtype), math.prod(ssm) * 4
            if item is None or conv_b + ssm_b == item:
                out.append(ComponentSpec(f"{prefix}mamba_conv", dtype, conv, nbytes=conv_b, draft=draft))
                out.append(ComponentSpec(f"{prefix}mamba_ssm", "float32", ssm, nbytes=ssm_b, draft=draft))
                continue
        # one tensor per state component, shape state_dims[j], state_item_lens[j] bytes
        out.append(ComponentSpec(f"{prefix}{t}", dtype, d or None, nbytes=item, draft=draft))
    return out


@dataclass(frozen=True)
class PayloadSpec:
    """The ordered components decode expects in every transfer (from its registration)."""

    components: tuple[ComponentSpec, ...]

    @property
    def names(self) -> list[str]:
        return [c.name for c in self.components]

    @classmethod
    def from_registration(cls, info: RegistrationInfo) -> PayloadSpec:
        """The contract with `ModelRunner.export_request()` (see the module docstring)."""
        m = info.model
        comps = _paged_kv("kv", m.dtype, info.page_size, info.kv_item_lens, m.shapes, False)
        comps += _states("", m.dtype, info.state_types, info.state_item_lens, info.state_dims, False)
        if info.draft is not None:
            d = info.draft
            dm = d.model
            comps += _paged_kv("draft.kv", dm.dtype, d.page_size, d.kv_item_lens, dm.shapes, True)
            comps += _states("draft.", dm.dtype, d.state_types, d.state_item_lens, d.state_dims, True)
        return cls(tuple(comps))

    def max_frame_bytes(self, max_length: int) -> int:
        """The largest tensor frame a payload of at most `max_length` cached tokens can carry (the receiver's
        ZMQ_MAXMSGSIZE); components of unknown size leave it at `UNBOUNDED_FRAME_BYTES`."""
        biggest = wire.MAX_CONTROL_BYTES
        for c in self.components:
            if c.page_bytes is not None and c.page_size:
                biggest = max(biggest, -(-max(0, max_length) // c.page_size) * c.page_bytes)
            elif c.nbytes is not None:
                biggest = max(biggest, c.nbytes)
            else:
                return UNBOUNDED_FRAME_BYTES
        return biggest

    def problems(
        self, length: int, metas: Sequence[TensorMeta], *, draft_length: int | None = None
    ) -> list[tuple[str, str]]:
        """Every (field, message) by which a payload of `length` cached tokens (and `draft_length`
        draft tokens, default `length`) with tensors `metas` differs from this spec."""
        out: list[tuple[str, str]] = []
        got = [m.name for m in metas]
        want = self.names
        if length < 0:
            out.append(("length", f"negative length {length}"))
        if got != want:
            if len(got) != len(want):
                out.append(
                    ("components", f"component count mismatch (expected {len(want)} {want}, got {len(got)} {got})")
                )
            elif sorted(got) == sorted(want):
                out.append(("components", f"components in a different order (expected {want}, got {got})"))
            else:
                i = next(k for k, (a, b) in enumerate(zip(want, got, strict=True)) if a != b)
                out.append(("components", f"component {i} is {got[i]!r}, expected {want[i]!r} (expected {want})"))
            return out
        for spec, meta in zip(self.components, metas, strict=True):
            n = draft_length if (spec.draft and draft_length is not None) else length
            if meta.dtype != spec.dtype:
                out.append((f"{spec.name}.dtype", f"{spec.name}: dtype {meta.dtype}, expected {spec.dtype}"))
                continue
            shape = spec.expected_shape(n)
            if shape is not None and tuple(meta.shape) != shape:
                out.append(
                    (
                        f"{spec.name}.shape",
                        f"{spec.name}: shape {list(meta.shape)}, expected {list(shape)} for length {n}",
                    )
                )
                continue
            if spec.page_bytes is not None and spec.page_size:
                want_b = -(-n // spec.page_size) * spec.page_bytes
                if meta.nbytes != want_b:
                    out.append(
                        (f"{spec.name}.nbytes", f"{spec.name}: {meta.nbytes} bytes, expected {want_b} for length {n}")
                    )
            elif spec.nbytes is not None and meta.nbytes != spec.nbytes:
                out.append((f"{spec.name}.nbytes", f"{spec.name}: {meta.nbytes} bytes, registered {spec.nbytes}"))
        return out


# --------------------------------------------------------------------------------------------- payload


@dataclass
class Payload:
    """One received request: tensors view transport memory until `release()`."""

    request_id: str
    length: int
    tensors: dict[str, Any]
    result: PrefillResult | None = None
    nbytes: int = 0
    _release: weakref.finalize[[], Payload] | None = None  # hands the transport memory back

    def release(self) -> None:
        """Hand the transport memory back (shm: the segment returns to prefill). Idempotent."""
        if self._release is not None:
            self._release()
        self.tensors = {}

    def __enter__(self) -> Payload:
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()


@dataclass(frozen=True)
class TransferResult:
    """Outcome of one sent request: acknowledged (error None) or failed."""

    request_id: str
    nbytes: int
    seconds: float
    error: TransferError | None = None


@dataclass
class _Pending:
    request_id: str
    t0: float
    deadline: float
    nbytes: int
    segment: _Segment | None


def shm_dir() -> str:
    return "/dev/shm" if os.path.isdir("/dev/shm") else tempfile.gettempdir()


def cleanup_stale_segments(directory: str | None = None) -> int:
    """Remove segments left by sender processes that no longer exist (e.g. killed with -9)."""
    directory = directory or shm_dir()
    removed = 0
    for name in os.listdir(directory):
        if not _SEGMENT_RE.match(name):
            continue
        pid = int(name.split("-")[2])
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            try:
                os.unlink(os.path.join(directory, name))
                removed += 1
            except OSError:
                pass
        except PermissionError:
            pass
    return removed


class _Segment:
    def __init__(self, directory: str, size: int) -> None:
        self.name = f"specctl-shm-{os.getpid()}-{uuid.uuid4().hex[:12]}-{size}"
        self.path = os.path.join(directory, self.name)
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600)
        try:
            os.ftruncate(fd, size)
            self.mm = mmap.mmap(fd, size)
        finally:
            os.close(fd)
        self.size = size
        self.busy = False

    def close(self) -> None:
        try:
            os.unlink(self.path)
        except OSError:
            pass
        try:
            self.mm.close()
        except BufferError:
            pass  # a view still exists; the mapping goes with it


# --------------------------------------------------------------------------------------------- sender


class TransferSender:
    """Prefill's end: pushes payloads to decode's receiver endpoint; decode acknowledges each.

    `send()` is submit-and-wait. For a pipeline, `submit()` several and `collect()` their outcomes
    (at most one per submitted request, in completion order). With the zmq backend the tensors are
    sent zero-copy: keep them unchanged until their outcome; with shm they are copied into the
    segment during `submit()`, so the caller may reuse its memory at once.
    """

    def __init__(
        self,
        endpoint: str,
        *,
        backend: str = "zmq",
        timeout_s: float = 30.0,
        ctx: zmq.Context[Any] | None = None,
        shm_directory: str | None = None,
        max_shm_bytes: int = 2 << 30,
        key: bytes | wire.Seal | None = None,
    ) -> None:
        """`key`: the session's key, or its sender-side `transfer_seal` (shared by every sender of the session, so
        the counters the receiver checks never restart)."""
        if backend not in BACKENDS:
            raise RuntimeFailure(f"unknown transfer backend {backend!r}", hint=f"one of {', '.join(BACKENDS)}")
        self.endpoint = endpoint
        self.backend = backend
        self.timeout_s = timeout_s
        self.seal: wire.Seal | None = key if isinstance(key, wire.Seal) else (
            transfer_seal(key, "prefill") if key is not None else None)
        self.key = self.seal.key if self.seal is not None else None
        self.auth_failures = 0
        self._ctx = ctx or zmq.Context.instance()
        self._dir = shm_directory or shm_dir()
        self._max_shm = max_shm_bytes
        self._segments: list[_Segment] = []
        if backend == "shm":
            cleanup_stale_segments(self._dir)  # what a predecessor killed with -9 left behind
        self._pending: dict[str, _Pending] = {}
        self._done: collections.deque[TransferResult] = collections.deque()
        self._sock: zmq.Socket[Any] | None = None
        self._monitor: zmq.Socket[Any] | None = None
        self._connect()

    # ------------------------------------------------------------------ connection
    def _connect(self) -> None:
        sock = wire.make_socket(self._ctx, zmq.DEALER)
        # Queue messages only on a live connection: a send before decode is reachable times out
        # instead of being delivered later to whoever binds the endpoint.
        sock.setsockopt(zmq.IMMEDIATE, 1)
        self._monitor = sock.get_monitor_socket(zmq.EVENT_CONNECTED | zmq.EVENT_DISCONNECTED)
        try:
            sock.connect(self.endpoint)
        except zmq.ZMQError as exc:
            wire.close_socket(self._monitor)
            wire.close_socket(sock)
            self._monitor = None
            raise TransferError(f"cannot connect to decode's transfer endpoint {self.endpoint}: {exc}") from None
        self._sock = sock
        self._connected = False
        self._poller = zmq.Poller()
        self._poller.register(sock, zmq.POLLIN)
        self._poller.register(self._monitor, zmq.POLLIN)

    def _disconnect(self) -> None:
        if self._sock is not None:
            try:
                self._sock.disable_monitor()
            except zmq.ZMQError:
                pass
            wire.close_socket(self._monitor)
            wire.close_socket(self._sock)
        self._sock = self._monitor = None

    def _fail_all(self, make_error: Callable[[str], TransferError]) -> None:
        """The connection is unusable: every pending request fails, and we start over on a fresh
        socket (dropping whatever was queued for the old peer); segments the peer may still view
        are unlinked rather than reused."""
        for rid, p in list(self._pending.items()):
            self._done.append(TransferResult(rid, p.nbytes, time.perf_counter() - p.t0, make_error(rid)))
        self._pending.clear()
        self._disconnect()
        for seg in [s for s in self._segments if s.busy]:
            seg.close()
            self._segments.remove(seg)
        self._connect()

    def close(self) -> None:
        self._disconnect()
        for seg in self._segments:
            seg.close()
        self._segments.clear()

    def __enter__(self) -> TransferSender:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @property
    def pending(self) -> int:
        return len(self._pending)

    # ------------------------------------------------------------------ control messages
    def _drain_monitor(self) -> bool:
        """Consume queued connection events; True if a disconnect was among them."""
        lost = False
        assert self._monitor is not None
        while wire.readable(self._monitor):
            event = recv_monitor_message(self._monitor)["event"]
            if event == zmq.EVENT_CONNECTED:
                self._connected = True
            elif event == zmq.EVENT_DISCONNECTED:
                self._connected = False
                lost = True
        return lost

    @property
    def connected(self) -> bool:
        """Whether decode's receiver is connected right now (a dead decode shows False at once;
        a send to it would wait up to its timeout for decode to come back)."""
        if self._monitor is not None:
            self._drain_monitor()
        return self._connected

    def _on_message(self, msg: wire.Message) -> None:
        released = [msg.segment] if isinstance(msg, ShmRelease) else getattr(msg, "released", [])
        for seg in self._segments:
            if seg.name in released:
                seg.busy = False
        if not isinstance(msg, TransferAck):
            return
        p = self._pending.pop(msg.request_id, None)
        if p is None:
            return  # a late ack of a request that already timed out
        err = None
        if not msg.ok:
            err = TransferError(
                f"request {msg.request_id}: decode refused the transfer: {msg.error}",
                request_id=msg.request_id,
                field=msg.field,
            )
            if p.segment is not None:
                p.segment.busy = False  # decode never viewed it
        self._done.append(TransferResult(msg.request_id, p.nbytes, time.perf_counter() - p.t0, err))

    def _poll_once(self, wait_s: float) -> None:
        """Handle whatever arrives within wait_s: acks, releases, a disconnect, expired deadlines."""
        assert self._sock is not None and self._monitor is not None
        events = dict(self._poller.poll(max(0, int(wait_s * 1000))))
        if self._sock in events:
            while wire.readable(self._sock):
                frames = self._sock.recv_multipart(copy=False)
                if self.seal is not None:
                    body = self.seal.open(frames)
                    if body is None:
                        self.auth_failures += 1  # a forged or replayed ack or release is never acted on
                        continue
                    frames = body
                try:
                    self._on_message(wire.decode(frames, as_torch=False).msg)
                except wire.WireError:
                    continue
        if self._monitor in events and self._drain_monitor() and self._pending:
            self._fail_all(
                lambda rid: TransferError(
                    f"request {rid}: decode disconnected during the transfer (peer gone)",
                    request_id=rid,
                    field="connection",
                )
            )
            return
        now = time.monotonic()
        expired = [rid for rid, p in self._pending.items() if p.deadline <= now]
        if expired:
            # A silent peer: nothing queued on this socket can be trusted to arrive, so start over.
            timeout = self.timeout_s
            self._fail_all(
                lambda rid: TransferTimeout(
                    f"request {rid}: decode did not acknowledge the transfer within {timeout:g}s",
                    request_id=rid,
                    field="ack",
                    hint="is decode alive and keeping up?",
                )
            )

    # ------------------------------------------------------------------ shm staging
    def _segment_for(self, nbytes: int, request_id: str, deadline: float) -> _Segment:
        brief_wait = time.monotonic() + 0.01
        while True:
            free = [s for s in self._segments if not s.busy and s.size >= nbytes]
            if free:
                return min(free, key=lambda s: s.size)
            # A segment decode acknowledged is usually released a moment later: reusing it (pages
            # already mapped) beats faulting in a fresh one.
            in_flight = {id(p.segment) for p in self._pending.values()}
            if any(s.size >= nbytes and id(s) not in in_flight for s in self._segments if s.busy):
                if time.monotonic() < min(deadline, brief_wait):
                    self._poll_once(0.002)
                    continue
            total = sum(s.size for s in self._segments)
            if total + nbytes <= self._max_shm:
                seg = _Segment(self._dir, max(1 << 20, -(-nbytes // (1 << 20)) * (1 << 20)))
                self._segments.append(seg)
                return seg
            idle = [s for s in self._segments if not s.busy]
            if idle:  # all too small: drop one to make room for a bigger one
                idle[0].close()
                self._segments.remove(idle[0])
                continue
            if time.monotonic() >= deadline:
                raise TransferTimeout(
                    f"request {request_id}: no shared memory free within {self.timeout_s:g}s "
                    f"(decode holds {total} bytes unreleased)",
                    request_id=request_id,
                    field="shm",
                )
            self._poll_once(min(0.05, deadline - time.monotonic()))

    def _stage_shm(self, request_id: str, length: int, tensors: Mapping[str, Any], result: PrefillResult | None,
                   deadline: float) -> tuple[ShmPayload, _Segment]:
        metas: list[TensorMeta] = []
        raws: list[memoryview] = []
        offsets: list[int] = []
        off = 0
        for name, t in tensors.items():
            dtype, shape, raw = wire.tensor_buffer(t)
            metas.append(TensorMeta(name, dtype, shape))
            raws.append(raw)
            offsets.append(off)
            off += -(-raw.nbytes // _ALIGN) * _ALIGN
        seg = self._segment_for(max(off, 1), request_id, deadline)
        for raw, o in zip(raws, offsets, strict=True):
            seg.mm[o : o + raw.nbytes] = raw  # the one copy of the shm path
        seg.busy = True
        msg = ShmPayload(
            request_id=request_id,
            length=length,
            components=[m.name for m in metas],
            segment=seg.name,
            metas=metas,
            offsets=offsets,
            result=result,
        )
        return msg, seg

    # ------------------------------------------------------------------ submit / collect / send
    def submit(
        self,
        request_id: str,
        tensors: Mapping[str, Any],
        *,
        length: int,
        result: PrefillResult | None = None,
        timeout_s: float | None = None,
    ) -> None:
        """Send one request's payload without waiting for the ack (see collect()). Raises
        TransferError at once when it cannot even be handed to the socket."""
        timeout = self.timeout_s if timeout_s is None else timeout_s
        if request_id in self._pending:
            raise TransferError(f"request {request_id} is already in flight", request_id=request_id, field="request_id")
        t0 = time.perf_counter()
        deadline = time.monotonic() + timeout
        if self._sock is None:
            self._connect()
        assert self._sock is not None
        if self._drain_monitor() and self._pending:  # a disconnect nobody has seen yet
            self._poll_once(0)
        tensors = canonical_order(tensors)
        seg = None
        try:
            if self.backend == "shm":
                msg, seg = self._stage_shm(request_id, length, tensors, result, deadline)
                nbytes = sum(m.nbytes for m in msg.metas)
                wire.send(self._sock, msg, timeout_s=max(0.0, deadline - time.monotonic()), seal=self.seal)
            else:
                header = TransferHeader(request_id=request_id, length=length, components=list(tensors), result=result)
                nbytes = sum(wire.tensor_nbytes(t) for t in tensors.values())
                wire.send(self._sock, header, tensors, timeout_s=max(0.0, deadline - time.monotonic()),
                          seal=self.seal)
        except wire.WireError as exc:
            if seg is not None:
                seg.busy = False
            err_cls = TransferTimeout if isinstance(exc, wire.WireTimeout) else TransferError
            self._fail_all(
                lambda rid: TransferError(
                    f"request {rid}: connection to decode reset", request_id=rid, field="connection"
                )
            )
            raise err_cls(
                f"request {request_id}: could not send to decode at {self.endpoint}: {exc}",
                request_id=request_id,
                field="connection",
            ) from None
        self._pending[request_id] = _Pending(request_id, t0, deadline, nbytes, seg)

    def collect(self, timeout_s: float = 0.0, *, request_id: str | None = None) -> list[TransferResult]:
        """Outcomes finished so far (waiting up to timeout_s for at least one, or for `request_id`'s).
        A result with `.error` set failed; the caller frees that request's pages either way."""
        deadline = time.monotonic() + timeout_s
        while True:
            if self._sock is not None and (self._pending or not self._done):
                self._poll_once(0)
            if request_id is not None:
                hit = [r for r in self._done if r.request_id == request_id]
                if hit:
                    self._done.remove(hit[0])
                    return hit
                if request_id not in self._pending:
                    return []
            elif self._done:
                out = list(self._done)
                self._done.clear()
                return out
            left = deadline - time.monotonic()
            if left <= 0 or not self._pending:
                return []
            self._poll_once(min(left, 0.1))

    def send(
        self,
        request_id: str,
        tensors: Mapping[str, Any],
        *,
        length: int,
        result: PrefillResult | None = None,
        timeout_s: float | None = None,
    ) -> TransferResult:
        """Send one request and wait for decode's ack. Raises TransferError (decode refused the payload:
        `.field` says why; or the peer disconnected) or TransferTimeout."""
        timeout = self.timeout_s if timeout_s is None else timeout_s
        self.submit(request_id, tensors, length=length, result=result, timeout_s=timeout)
        res = self.collect(timeout + 1.0, request_id=request_id)
        if not res:  # cannot happen: the deadline check fails it first; kept as a clear invariant
            raise TransferTimeout(f"request {request_id}: no outcome", request_id=request_id, field="ack")
        if res[0].error is not None:
            raise res[0].error
        return res[0]

    def wait_released(self, timeout_s: float) -> bool:
        """shm: wait until decode handed every segment back (True) or the timeout passed (False)."""
        deadline = time.monotonic() + timeout_s
        while any(s.busy for s in self._segments):
            if time.monotonic() >= deadline or self._sock is None:
                return False
            self._poll_once(min(0.05, deadline - time.monotonic()))
        return True


# --------------------------------------------------------------------------------------------- receiver


class TransferReceiver:
    """Decode's end: binds `bind` (tcp://host:0 picks a port; ipc://path), checks and acks payloads."""

    def __init__(
        self,
        spec: PayloadSpec | None = None,
        *,
        bind: str = "tcp://127.0.0.1:0",
        timeout_s: float = 30.0,
        ctx: zmq.Context[Any] | None = None,
        as_torch: bool = True,
        shm_directory: str | None = None,
        auth: Callable[[str], bytes | None] | None = None,
        backend: str = "zmq",
        max_message_bytes: int = UNBOUNDED_FRAME_BYTES,
    ) -> None:
        """`max_message_bytes` bounds one frame (ZMQ_MAXMSGSIZE, fixed at bind): a peer sending more is
        disconnected before the frame is buffered; `spec.max_frame_bytes(max tokens)` is the right bound."""
        if backend not in BACKENDS:
            raise RuntimeFailure(f"unknown transfer backend {backend!r}", hint=f"one of {', '.join(BACKENDS)}")
        self.spec = spec
        self.auth = auth
        self.backend = backend
        self.auth_failures = 0
        self.rejections: collections.Counter[str] = collections.Counter()  # refused messages, by reason
        self.timeout_s = timeout_s
        self.as_torch = as_torch
        self._dir = shm_directory or shm_dir()
        self._ctx = ctx or zmq.Context.instance()
        self._sock = wire.make_socket(self._ctx, zmq.ROUTER, max_message_bytes=max_message_bytes)
        self.endpoint = wire.bind(self._sock, bind)
        self._maps: collections.OrderedDict[str, mmap.mmap] = collections.OrderedDict()
        self._releases: collections.deque[tuple[bytes, str, bytes | None]] = collections.deque()
        self._lock = threading.Lock()
        self._seals: collections.OrderedDict[bytes, wire.Seal] = collections.OrderedDict()  # per session key

    def set_spec(self, spec: PayloadSpec | None) -> None:
        self.spec = spec

    def close(self) -> None:
        wire.close_socket(self._sock)
        for mm in self._maps.values():
            try:
                mm.close()
            except BufferError:
                pass
        self._maps.clear()

    def __enter__(self) -> TransferReceiver:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _seal(self, key: bytes | None) -> wire.Seal | None:
        """The receiver-side seal of the session whose key is `key` (its counters live as long as the session)."""
        if key is None:
            return None
        with self._lock:
            seal = self._seals.get(key)
            if seal is None:
                seal = self._seals[key] = transfer_seal(key, "decode")
                while len(self._seals) > MAX_SESSION_SEALS:
                    self._seals.popitem(last=False)
            self._seals.move_to_end(key)
            return seal

    def flush(self) -> None:
        """Send pending shm releases (recv() does this too)."""
        while True:
            with self._lock:
                if not self._releases:
                    return
                identity, segment, key = self._releases.popleft()
            try:
                wire.send(self._sock, ShmRelease(segment=segment), timeout_s=0.5, identity=identity,
                          seal=self._seal(key))
            except wire.WireError:
                pass  # the sender is gone; nothing to give back

    def _ack(self, identity: bytes | None, request_id: str, ok: bool, error: str = "", field: str = "") -> None:
        if identity is None:
            return
        with self._lock:
            mine = [e for e in self._releases if e[0] == identity]
            for entry in mine:
                self._releases.remove(entry)
        released = [segment for _, segment, _ in mine]
        try:
            wire.send(
                self._sock,
                TransferAck(request_id=request_id, ok=ok, error=error, field=field, released=released),
                timeout_s=0.5,
                identity=identity,
                seal=self._seal(self.auth(request_id)) if self.auth is not None else None,
            )
        except wire.WireError:
            pass  # the sender vanished; it gets its own error

    def _fail(self, identity: bytes | None, request_id: str, field: str, message: str) -> TransferError:
        self.rejections[field.split(".")[-1]] += 1
        self._ack(identity, request_id, False, message, field)
        return TransferError(f"request {request_id}: transfer rejected: {message}", request_id=request_id, field=field)

    def _attach(self, name: str) -> mmap.mmap:
        mm = self._maps.get(name)
        if mm is not None:
            self._maps.move_to_end(name)
            return mm
        if not _SEGMENT_RE.match(name):  # never open an arbitrary path named by a peer
            raise ValueError(f"invalid segment name {name!r}")
        fd = os.open(os.path.join(self._dir, name), os.O_RDWR)
        try:
            mm = mmap.mmap(fd, os.fstat(fd).st_size)
        finally:
            os.close(fd)
        # Unmap segments the sender has unlinked (it failed over or shrank its pool): their memory
        # is only returned once nobody maps them. Beyond MAX_MAPPED_SEGMENTS the least recently used go too
        # (each mapping holds a descriptor). One still viewed by a live payload stays.
        self._maps[name] = mm
        over = len(self._maps) - MAX_MAPPED_SEGMENTS
        for old_name in list(self._maps):
            if old_name == name:
                continue
            if over > 0 or not os.path.exists(os.path.join(self._dir, old_name)):
                try:
                    self._maps[old_name].close()
                    del self._maps[old_name]
                    over -= 1
                except BufferError:
                    pass
        return mm

    def _release_fn(self, identity: bytes, segment: str, key: bytes | None) -> Callable[[], None]:
        def release() -> None:
            with self._lock:  # release() may run on any thread; the socket is only used by recv()
                self._releases.append((identity, segment, key))

        return release

    def recv(self, timeout_s: float | None = None) -> Payload:
        """The next checked payload. Raises TransferTimeout when none arrives within the timeout, and
        TransferError(request_id, field) for a payload that does not match the spec (prefill is told)."""
        timeout = self.timeout_s if timeout_s is None else timeout_s
        deadline = time.monotonic() + timeout
        while True:
            # Releases ride on the next ack when a payload is already waiting; otherwise they go alone.
            if not wire.readable(self._sock):
                self.flush()
                left = deadline - time.monotonic()
                if left <= 0:
                    raise TransferTimeout(f"no transfer arrived within {timeout:g}s", field="timeout")
                if not self._sock.poll(int(min(left, 0.05) * 1000) + 1, zmq.POLLIN):
                    continue
            frames = self._sock.recv_multipart(copy=False)
            identity, frames = frames[0].bytes, frames[1:]
            if self.auth is not None:
                # Only a room some session claimed has a key; only that session's MAC opens it.
                seal = self._seal(self.auth(_peek_request_id(frames[0].bytes if frames else b"")))
                body = seal.open(frames) if seal is not None else None
                if body is None:
                    self.auth_failures += 1
                    self.rejections[seal.last_refusal if seal is not None else "auth"] += 1
                    continue  # dropped unanswered: an unauthenticated or replayed payload is never acted on
                frames = body
            try:
                env = wire.decode(frames, as_torch=self.as_torch)
            except wire.WireError as exc:
                rid = _peek_request_id(frames[0].bytes if frames else b"")
                raise self._fail(identity, rid, "message", str(exc)) from None
            msg = env.msg
            if isinstance(msg, TransferHeader):
                return self._accept_zmq(identity, msg, env)
            if isinstance(msg, ShmPayload):
                return self._accept_shm(identity, msg)
            # anything else on this socket is ignored (not ours to answer)

    def _check(self, identity: bytes, rid: str, length: int, components: list[str], metas: list[TensorMeta],
               result: PrefillResult | None) -> None:  # fmt: skip
        if components != [m.name for m in metas]:
            raise self._fail(
                identity, rid, "components", f"header lists {components}, tensors are {[m.name for m in metas]}"
            )
        if self.spec is None:
            return
        draft_length = result.draft_length if result is not None else None
        problems = self.spec.problems(length, metas, draft_length=draft_length)
        if problems:
            raise self._fail(identity, rid, problems[0][0], "; ".join(p[1] for p in problems))

    def _accept_zmq(self, identity: bytes, msg: TransferHeader, env: wire.Envelope) -> Payload:
        metas = list(env.metas)
        self._check(identity, msg.request_id, msg.length, msg.components, metas, msg.result)
        self._ack(identity, msg.request_id, True)
        nbytes = sum(m.nbytes for m in metas)
        return Payload(msg.request_id, msg.length, dict(env.tensors), msg.result, nbytes)

    def _accept_shm(self, identity: bytes, msg: ShmPayload) -> Payload:
        rid = msg.request_id
        if self.backend != "shm":  # never map a segment a peer names on a deployment that does not use shm
            raise self._fail(identity, rid, "backend", "a shared-memory payload on a zmq-backend deployment")
        for meta in msg.metas:
            try:
                wire.check_meta(meta, "transfer.shm")
            except wire.WireError as exc:
                raise self._fail(identity, rid, "metas", str(exc)) from None
        # The header checks out before anything is mapped: spec, offsets, the segment's name and size.
        self._check(identity, rid, msg.length, msg.components, msg.metas, msg.result)
        if len(msg.offsets) != len(msg.metas):
            raise self._fail(identity, rid, "offsets", f"{len(msg.offsets)} offsets for {len(msg.metas)} tensors")
        end = max((o + m.nbytes for o, m in zip(msg.offsets, msg.metas, strict=True)), default=0)
        if any(o < 0 for o in msg.offsets) or not _SEGMENT_RE.match(msg.segment) or \
                end > int(msg.segment.rsplit("-", 1)[-1]):
            raise self._fail(identity, rid, "segment", f"segment {msg.segment!r} cannot hold the payload it names")
        try:
            mm = self._attach(msg.segment)
        except (OSError, ValueError) as exc:
            raise self._fail(identity, rid, "segment", f"cannot map shared memory {msg.segment!r}: {exc}") from None
        tensors: dict[str, Any] = {}
        for meta, off in zip(msg.metas, msg.offsets, strict=True):
            if off < 0 or off + meta.nbytes > len(mm):
                raise self._fail(
                    identity, rid, f"{meta.name}.offset", f"{meta.name} lies outside segment {msg.segment}"
                )
            try:
                tensors[meta.name] = wire.buffer_tensor(mm, meta, as_torch=self.as_torch, offset=off)
            except wire.WireError as exc:
                raise self._fail(identity, rid, f"{meta.name}.dtype", str(exc)) from None
        self._ack(identity, rid, True)
        payload = Payload(rid, msg.length, tensors, msg.result, sum(m.nbytes for m in msg.metas))
        # Released explicitly, or when the payload is collected: the segment goes back to prefill.
        key = self.auth(rid) if self.auth is not None else None
        payload._release = weakref.finalize(payload, self._release_fn(identity, msg.segment, key))
        return payload


def _peek_request_id(header: bytes) -> str:
    try:
        _, _, _, body, _ = msgspec.msgpack.decode(header, type=tuple[str, int, str, msgspec.Raw, msgspec.Raw])
        return str(msgspec.msgpack.decode(body).get("request_id", "?"))
    except Exception:
        return "?"
