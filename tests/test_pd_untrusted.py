"""A peer's bytes never raise past the PD plane and never learn prefill's values, on real sockets: deeply nested
msgpack, impossible tensor shapes and unknown dtypes are counted refusals (never a traceback), and a registration
refused without a proven secret names the differing fields and the peer's own values only."""

from __future__ import annotations

import logging
from dataclasses import replace

import msgspec
import numpy as np
import pytest
import zmq

from specctl.engine.pd import wire
from specctl.engine.pd.bootstrap import BootstrapServer, HandshakeRejected, Hello, Register, register
from specctl.engine.pd.messages import MAX_RNG_STATE_BYTES, PrefillResult
from specctl.engine.pd.registration import build_registration
from specctl.engine.pd.transfer import TransferError, TransferHeader, TransferReceiver

from test_handshake_bootstrap import LAYOUT, _dec, _pre  # isort: skip

DEPTH = 100_000


def _deep_claim() -> bytes:
    """A pd.claim header with a field `params` nesting DEPTH maps deep (msgpack fixmap of one key, repeated): a
    field the claim does not know is still walked by the decoder, so the depth must be refused, not crash it."""
    nested = b"\x81\xa1k" * DEPTH + b"\xc0"
    body = (b"\x85\xa3tag\xa8pd.claim\xa6req_id\xa6room-1\xaaprompt_ids\x91\x01\xa6params" + nested
            + b"\xaapairing_id\xa1x")
    return b"\x95\xa7specctl" + msgspec.msgpack.encode(wire.PROTOCOL_VERSION) + b"\xa8pd.claim" + body + b"\x90"


def _header(shape: list[int], dtype: str = "float32") -> bytes:
    return msgspec.msgpack.encode(("specctl", wire.PROTOCOL_VERSION, "transfer.payload",
                                   TransferHeader(request_id="room-9", length=1, components=["kv"]),
                                   [("kv", dtype, shape)]))


@pytest.mark.parametrize(("frames", "why"), [
    ([_deep_claim()], "RecursionError"),
    ([_header([0, -1]), b""], "invalid shape"),
    ([_header([2, 3], "complex128"), b"x" * 96], "unsupported tensor dtype"),
    ([_header([1] * 40), b"\0" * 4], "invalid shape"),
    ([b"\xdc\xff\xff" + b"\x91" * 60000], "header"),
], ids=["deep-msgpack", "shape-0,-1", "unknown-dtype", "40-dims", "deep-header"])
def test_untrusted_bytes_are_a_wire_error_never_another_exception(frames: list[bytes], why: str) -> None:
    with pytest.raises(wire.WireError) as err:
        wire.decode(frames)
    assert why in str(err.value)


def test_a_receiver_counts_hostile_payloads_and_keeps_serving(tmp_path, caplog) -> None:
    with TransferReceiver(None, bind=f"ipc://{tmp_path}/rx", as_torch=False) as rx:
        sock = wire.make_socket(zmq.Context.instance(), zmq.DEALER)
        sock.connect(rx.endpoint)
        try:
            with caplog.at_level(logging.DEBUG):
                for frames in ([_header([0, -1]), b""], [_header([1] * 40), b"\0" * 4], [_deep_claim()]):
                    sock.send_multipart(frames)
                    with pytest.raises(TransferError):
                        rx.recv(timeout_s=5)
            assert sum(rx.rejections.values()) == 3
            assert not [r for r in caplog.records if r.exc_info]
        finally:
            sock.close(0)


def test_the_bootstrap_refuses_hostile_bytes_and_counts_them() -> None:
    with BootstrapServer(_pre()) as srv:
        ctx = zmq.Context.instance()
        sock = wire.make_socket(ctx, zmq.DEALER)
        sock.connect(srv.endpoint)
        try:
            sock.send_multipart([_deep_claim()])
            reply = wire.recv(sock, timeout_s=5).msg
            assert "malformed" in reply.reason
        finally:
            sock.close(0)
        assert srv.stats.rejected_by.get("malformed") == 1
        register(srv.endpoint, _dec(), timeout_s=5)  # and it still pairs


def test_a_refusal_without_a_proven_secret_names_fields_never_prefills_values() -> None:
    prefill = build_registration("prefill", replace(LAYOUT, page_size=48, weights_hash="prefill-secret-hash"))
    decode = build_registration("decode", replace(LAYOUT, page_size=32), endpoints={"transfer": "tcp://127.0.0.1:7"})
    with BootstrapServer(prefill) as srv:
        ctx = zmq.Context.instance()
        hello = wire.request(ctx, srv.endpoint, Hello(client_nonce=b"c" * 32), timeout_s=5).msg
        info = msgspec.msgpack.encode(decode)
        raw = wire.request(ctx, srv.endpoint, Register(info=info, nonce=hello.nonce, client_nonce=b"c" * 32),
                           timeout_s=5, retries=1).frames
        with pytest.raises(HandshakeRejected) as err:
            register(srv.endpoint, decode, timeout_s=5)
    fields = {m.field for m in err.value.mismatches}
    assert {"page_size", "model.weights_hash"} <= fields
    assert all(m.prefill is None for m in err.value.mismatches)
    wire_bytes = b"".join(f.bytes for f in raw)
    for value in (b"prefill-secret-hash", b"48"):
        assert value not in wire_bytes and value.decode() not in str(err.value)
    # with a secret the peer proved, the values are shown (it is one of the deployment's own processes)
    with BootstrapServer(prefill, secret="s") as srv, pytest.raises(HandshakeRejected) as err:
        register(srv.endpoint, decode, secret="s", timeout_s=5)
    assert any(m.prefill == 48 for m in err.value.mismatches)



@pytest.mark.parametrize(("result", "field"), [
    (PrefillResult(first_token=-1), "first_token"),
    (PrefillResult(first_token=1, draft_length=-3), "draft_length"),
    (PrefillResult(first_token=1, rng_state=b"\0" * (MAX_RNG_STATE_BYTES + 1)), "rng_state"),
    (PrefillResult(first_token=1, queue_s=-1.0), "queue_s"),
], ids=["negative-token", "negative-draft", "rng-too-long", "negative-time"])
def test_a_prefill_result_out_of_its_bounds_is_a_counted_refusal(tmp_path, result: PrefillResult, field: str) -> None:
    """The typed result in a payload's header is checked as it is decoded: a value out of its bounds fails that
    payload naming the field, counted, never a traceback (msgspec builds structs unchecked; the wire checks)."""
    with TransferReceiver(None, bind=f"ipc://{tmp_path}/rx", as_torch=False) as rx:
        sock = wire.make_socket(zmq.Context.instance(), zmq.DEALER)
        sock.connect(rx.endpoint)
        try:
            header = TransferHeader(request_id="room-3", length=1, components=["kv"], result=result)
            wire.send(sock, header, {"kv": np.zeros((1, 4), dtype=np.float32)}, timeout_s=5)
            with pytest.raises(TransferError, match=field) as err:
                rx.recv(timeout_s=5)
            assert err.value.request_id == "room-3" and sum(rx.rejections.values()) == 1
        finally:
            sock.close(0)
