"""Everything on the PD plane is bounded, on real sockets: sessions per bootstrap, the size of a frame a peer may
send (ZMQ_MAXMSGSIZE disconnects it before the frame is buffered), and shared memory, which a zmq deployment never
maps and an shm deployment maps only once the payload's header checks out."""

from __future__ import annotations

import os
import time

import numpy as np
import pytest
import zmq

from specctl.engine.pd import wire
from specctl.engine.pd.bootstrap import BootstrapServer, HandshakeRejected, register
from specctl.engine.pd.transfer import (
    PayloadSpec,
    ShmPayload,
    TransferError,
    TransferReceiver,
    TransferSender,
    TransferTimeout,
    canonical_order,
    shm_dir,
)
from specctl.engine.pd.wire import TensorMeta

from test_handshake_bootstrap import _dec, _pre  # isort: skip
from test_transfer_backends import _payload, _spec  # isort: skip


def _fds() -> int:
    """Descriptors this process holds on shared-memory segments (other descriptors come and go with ZeroMQ)."""
    count = 0
    for fd in os.listdir("/proc/self/fd"):
        try:
            target = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:
            continue
        count += os.path.basename(target).startswith("specctl-shm-")
    return count


def test_a_bootstrap_holds_a_bounded_number_of_sessions() -> None:
    with BootstrapServer(_pre(), max_sessions=3) as srv:
        for port in range(3):
            register(srv.endpoint, _dec(port + 10), timeout_s=5)
        with pytest.raises(HandshakeRejected, match="already serves 3 sessions"):
            register(srv.endpoint, _dec(20), timeout_s=5)
        assert len(srv.peers) == 3 and srv.stats.rejected_by == {"sessions": 1}


def test_a_frame_larger_than_any_payload_disconnects_its_sender_before_it_is_buffered(tmp_path) -> None:
    spec = _spec()
    limit = spec.max_frame_bytes(64)
    with TransferReceiver(spec, bind=f"ipc://{tmp_path}/rx", max_message_bytes=limit) as rx:
        assert wire.MAX_CONTROL_BYTES <= limit < 8 << 20
        ctx = zmq.Context.instance()
        big = ctx.socket(zmq.DEALER)
        big.setsockopt(zmq.LINGER, 0)
        big.connect(rx.endpoint)
        try:
            big.send(np.zeros(limit + 1024, dtype=np.uint8).data, copy=False)  # one frame over the bound
            with pytest.raises(TransferTimeout):
                rx.recv(timeout_s=1.0)  # never delivered: the peer was cut off
        finally:
            big.close(0)
        with TransferSender(rx.endpoint, timeout_s=10) as tx:  # a well-formed payload still goes through
            tx.submit("room-1", _payload(64), length=64)
            assert rx.recv(timeout_s=10).request_id == "room-1"
            assert tx.collect(10, request_id="room-1")[0].error is None


def _shm_message(segment: str, spec: PayloadSpec, *, components: list[str] | None = None) -> ShmPayload:
    tensors = canonical_order(_payload(16))
    metas = [TensorMeta(n, "float32", tuple(t.shape)) for n, t in tensors.items()]
    offsets, off = [], 0
    for m in metas:
        offsets.append(off)
        off += m.nbytes
    return ShmPayload(request_id="room-7", length=16, components=components or [m.name for m in metas],
                      segment=segment, metas=metas, offsets=offsets)


def _segment(size: int = 1 << 20) -> str:
    name = f"specctl-shm-{os.getpid()}-{os.urandom(6).hex()}-{size}"
    with open(os.path.join(shm_dir(), name), "wb") as f:
        f.truncate(size)
    return name


@pytest.mark.parametrize("backend", ["zmq", "shm"])
def test_shared_memory_is_mapped_only_on_shm_deployments_and_only_after_the_header_checks_out(
        tmp_path, backend: str) -> None:  # fmt: skip
    spec = _spec()
    segment = _segment()
    try:
        with TransferReceiver(spec, bind=f"ipc://{tmp_path}/rx", backend=backend) as rx:
            ctx = zmq.Context.instance()
            sock = wire.make_socket(ctx, zmq.DEALER)
            sock.connect(rx.endpoint)
            try:
                fds = _fds()
                # a header that does not match the registration: refused before the segment is touched
                bad = _shm_message(segment, spec, components=["kv"])
                for _ in range(50):
                    wire.send(sock, bad, timeout_s=5)
                    with pytest.raises(TransferError) as err:
                        rx.recv(timeout_s=5)
                    assert err.value.field in ("backend", "components")
                assert rx._maps == {} and _fds() == fds  # nothing mapped, no descriptor kept
                good = _shm_message(segment, spec)
                wire.send(sock, good, timeout_s=5)
                if backend == "zmq":
                    with pytest.raises(TransferError) as err:
                        rx.recv(timeout_s=5)
                    assert err.value.field == "backend" and rx._maps == {}
                    assert rx.rejections["backend"] == 51
                else:
                    payload = rx.recv(timeout_s=5)
                    assert payload.request_id == "room-7" and list(rx._maps) == [segment]
                    payload.release()
                    assert rx.rejections["components"] == 50
            finally:
                sock.close(0)
    finally:
        os.unlink(os.path.join(shm_dir(), segment))


def test_mapped_segments_are_bounded(tmp_path) -> None:
    spec = _spec()
    segments = [_segment() for _ in range(40)]
    try:
        with TransferReceiver(spec, bind=f"ipc://{tmp_path}/rx", backend="shm") as rx:
            sock = wire.make_socket(zmq.Context.instance(), zmq.DEALER)
            sock.connect(rx.endpoint)
            try:
                fds = _fds()
                for seg in segments:
                    wire.send(sock, _shm_message(seg, spec), timeout_s=5)
                    rx.recv(timeout_s=5).release()
                    time.sleep(0)
                assert len(rx._maps) <= 16 and _fds() <= fds + 16
            finally:
                sock.close(0)
    finally:
        for seg in segments:
            os.unlink(os.path.join(shm_dir(), seg))
