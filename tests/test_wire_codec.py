"""The wire: typed versioned headers, zero-copy tensor frames, no pickle, timeouts everywhere."""

from __future__ import annotations

import pickle
import threading
import time

import msgspec
import numpy as np
import pytest
import torch
import zmq

from specctl.engine.pd import wire


class Note(wire.Message, tag="test.note"):
    text: str
    n: int = 0


class Other(wire.Message, tag="test.other"):
    x: float


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16, torch.int64, torch.int32, torch.bool])
def test_torch_round_trip_is_exact(dtype) -> None:
    g = torch.Generator().manual_seed(0)
    t = (torch.randn(3, 5, 7, generator=g) * 100).to(dtype)
    env = wire.decode(wire.encode(Note(text="hi"), {"t": t, "slice": t[:, 1]}))
    assert env.msg == Note(text="hi")
    assert env.tensors["t"].dtype == dtype and torch.equal(env.tensors["t"], t)
    assert torch.equal(env.tensors["slice"], t[:, 1])  # non-contiguous input is made contiguous


def test_numpy_and_empty_tensors() -> None:
    a = np.arange(12, dtype=np.int16).reshape(3, 4)
    env = wire.decode(wire.encode(Note(text=""), {"a": a, "e": torch.zeros(0, 4)}), as_torch=False)
    assert env.tensors["a"].dtype == np.int16 and np.array_equal(env.tensors["a"], a)
    assert env.tensors["e"].shape == (0, 4)
    assert [m.name for m in env.metas] == ["a", "e"]


def test_tensor_frames_are_not_copied_on_send() -> None:
    t = torch.arange(1 << 16, dtype=torch.float32)
    frames = wire.encode(Note(text=""), {"t": t})
    raw = frames[1]
    assert isinstance(raw, memoryview)
    assert np.frombuffer(raw, dtype=np.uint8).ctypes.data == t.data_ptr()


def test_received_tensors_view_the_frame() -> None:
    ctx = zmq.Context.instance()
    a, b = ctx.socket(zmq.PAIR), ctx.socket(zmq.PAIR)
    try:
        port = a.bind_to_random_port("tcp://127.0.0.1")
        b.connect(f"tcp://127.0.0.1:{port}")
        t = torch.randn(256, 256)
        wire.send(b, Note(text="x"), {"t": t}, timeout_s=5)
        env = wire.recv(a, timeout_s=5)
        got = env.tensors["t"]
        assert torch.equal(got, t)
        frame_addr = np.frombuffer(env.frames[1].buffer, dtype=np.uint8).ctypes.data
        assert got.data_ptr() == frame_addr
    finally:
        a.close(linger=0)
        b.close(linger=0)


def test_version_magic_and_type_are_checked() -> None:
    header = msgspec.msgpack.encode(("specctl", wire.PROTOCOL_VERSION + 1, "test.note", Note(text="a"), []))
    with pytest.raises(wire.WireError, match=f"v{wire.PROTOCOL_VERSION + 1}"):
        wire.decode([header])
    with pytest.raises(wire.WireError, match="not a specctl message"):
        wire.decode([msgspec.msgpack.encode(("other", 1, "test.note", {}, []))])
    with pytest.raises(wire.WireError, match="unknown message type"):
        wire.decode([msgspec.msgpack.encode(("specctl", wire.PROTOCOL_VERSION, "nope", {}, []))])
    with pytest.raises(wire.WireError, match="unexpected message type"):
        wire.decode(wire.encode(Note(text="a")), expect=(Other,))
    with pytest.raises(wire.WireError, match="malformed"):
        wire.decode([msgspec.msgpack.encode(("specctl", wire.PROTOCOL_VERSION, "test.note", {"text": 5}, []))])


def test_frame_count_and_sizes_are_checked() -> None:
    frames = wire.encode(Note(text="a"), {"t": torch.zeros(4)})
    with pytest.raises(wire.WireError, match="declares 1 tensors but carries 0"):
        wire.decode(frames[:1])
    with pytest.raises(wire.WireError, match="needs 16"):
        wire.decode([frames[0], b"\x00" * 15])


def test_pickle_is_never_unpickled() -> None:
    class Boom:
        def __reduce__(self):
            return (pytest.fail, ("unpickled from the wire!",))

    with pytest.raises(wire.WireError):
        wire.decode([pickle.dumps(Boom())])


def test_recv_times_out() -> None:
    ctx = zmq.Context.instance()
    s = wire.make_socket(ctx, zmq.ROUTER)
    try:
        wire.bind(s, "tcp://127.0.0.1:0")
        t0 = time.monotonic()
        with pytest.raises(wire.WireTimeout, match="within 0.2s"):
            wire.recv(s, timeout_s=0.2)
        assert 0.15 < time.monotonic() - t0 < 2.0
    finally:
        wire.close_socket(s)


def test_send_to_a_vanished_router_peer_is_an_error() -> None:
    ctx = zmq.Context.instance()
    s = wire.make_socket(ctx, zmq.ROUTER)
    try:
        wire.bind(s, "tcp://127.0.0.1:0")
        with pytest.raises(wire.WireError, match="could not send"):
            wire.send(s, Note(text="x"), timeout_s=0.2, identity=b"nobody")
    finally:
        wire.close_socket(s)


def test_bind_conflict_is_a_clear_error() -> None:
    ctx = zmq.Context.instance()
    a, b = wire.make_socket(ctx, zmq.ROUTER), wire.make_socket(ctx, zmq.ROUTER)
    try:
        ep = wire.bind(a, "tcp://127.0.0.1:0")
        with pytest.raises(wire.WireError, match="cannot bind"):
            wire.bind(b, ep)
    finally:
        wire.close_socket(a)
        wire.close_socket(b)


def test_lazy_pirate_retries_on_a_fresh_socket() -> None:
    """The server drops the first request; the client's retry (new socket) gets the answer."""
    ctx = zmq.Context.instance()
    srv = wire.make_socket(ctx, zmq.ROUTER)
    ep = wire.bind(srv, "tcp://127.0.0.1:0")
    seen: list[bytes] = []

    def serve() -> None:
        for i in range(2):
            env = wire.recv(srv, timeout_s=10)
            seen.append(env.identity)
            if i == 1:
                wire.send(srv, Note(text="pong", n=i), timeout_s=5, identity=env.identity)

    th = threading.Thread(target=serve)
    th.start()
    try:
        env = wire.request(ctx, ep, Note(text="ping"), timeout_s=0.3, retries=3, expect=(Note,))
        assert env.msg == Note(text="pong", n=1)
        assert len(seen) == 2 and seen[0] != seen[1]  # the retry came on a fresh socket
    finally:
        th.join(10)
        wire.close_socket(srv)


def test_request_gives_up_after_bounded_retries() -> None:
    ctx = zmq.Context.instance()
    srv = wire.make_socket(ctx, zmq.ROUTER)  # bound but never answers
    ep = wire.bind(srv, "tcp://127.0.0.1:0")
    try:
        t0 = time.monotonic()
        with pytest.raises(wire.WireTimeout, match="after 3 attempt"):
            wire.request(ctx, ep, Note(text="ping"), timeout_s=0.2, retries=3)
        assert 0.5 < time.monotonic() - t0 < 3.0
    finally:
        wire.close_socket(srv)


def test_linger_zero_lets_the_context_terminate() -> None:
    ctx = zmq.Context()
    s = wire.make_socket(ctx, zmq.DEALER)
    s.connect("tcp://127.0.0.1:1")  # nobody there: the message stays queued
    s.send(b"queued")
    wire.close_socket(s)
    done = threading.Event()
    th = threading.Thread(target=lambda: (ctx.term(), done.set()), daemon=True)
    th.start()
    assert done.wait(2.0), "context.term() hung on a lingering message"
