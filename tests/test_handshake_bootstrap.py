"""Bootstrap endpoint and register(): shared-secret proofs, replay, re-registration, prefill restart,
timeouts, and a decode in a real separate process."""

from __future__ import annotations

import hashlib
import hmac
import json
import os
import subprocess
import sys
import textwrap
import threading
import time

import msgspec
import pytest
import zmq

from specctl.engine.cache_layout import CacheLayout
from specctl.engine.pd import wire
from specctl.engine.pd.bootstrap import (
    Accepted,
    BootstrapServer,
    Challenge,
    HandshakeRejected,
    Hello,
    Ping,
    Pong,
    Register,
    Rejected,
    open_sealed,
    ping,
    register,
    seal,
)
from specctl.engine.pd.registration import build_registration

LAYOUT = CacheLayout.from_json({
    "page_size": 16,
    "dtype": "float32",
    "kv_item_lens": [512],
    "state_types": ["mamba", "swa"],
    "state_item_lens": [16384, 1024],
    "state_dims": [[1, 4096], [2, 128]],
    "weights_hash": "abc123",
    "architecture": "SpecctlHybridForCausalLM",
    "layer_kinds": ["mamba", "swa", "full", "swa"],
    "vocab_size": 260,
})


def _pre():
    return build_registration("prefill", LAYOUT)


def _dec(port: int = 7):
    return build_registration("decode", LAYOUT, endpoints={"transfer": f"tcp://127.0.0.1:{port}"})


def test_shared_secret_accepts_the_right_one_only() -> None:
    with BootstrapServer(_pre(), secret="s3cret") as srv:
        with pytest.raises(HandshakeRejected, match="could not prove the shared secret"):
            register(srv.endpoint, _dec(), secret="wrong", timeout_s=5)
        with pytest.raises(HandshakeRejected, match="authentication required"):
            register(srv.endpoint, _dec(), timeout_s=5)
        assert srv.peer is None
        pairing = register(srv.endpoint, _dec(), secret=b"s3cret", timeout_s=5)
        assert srv.peer is not None and srv.peer.session_id == pairing.session_id


def test_decode_refuses_a_prefill_that_cannot_prove_the_secret() -> None:
    with BootstrapServer(_pre()) as srv:  # no secret on prefill
        with pytest.raises(HandshakeRejected, match="prefill could not prove"):
            register(srv.endpoint, _dec(), secret="s3cret", timeout_s=5)


def test_register_message_cannot_be_replayed() -> None:
    ctx = zmq.Context.instance()
    key = b"k"
    info = msgspec.msgpack.encode(_dec())
    with BootstrapServer(_pre(), secret=key) as srv:
        ch = wire.request(ctx, srv.endpoint, Hello(client_nonce=b"c" * 32), timeout_s=5).msg
        assert isinstance(ch, Challenge) and ch.auth_required
        proof = hmac.new(key, ch.nonce + info, hashlib.sha256).digest()
        reg = Register(info=info, nonce=ch.nonce, client_nonce=b"c" * 32, proof=proof)
        first = wire.request(ctx, srv.endpoint, reg, timeout_s=5).msg
        assert isinstance(first, Accepted)
        again = wire.request(ctx, srv.endpoint, reg, timeout_s=5).msg
        assert isinstance(again, Rejected) and "nonce" in again.reason
        # the proof binds the registration it came with: swapping the info is refused
        ch2 = wire.request(ctx, srv.endpoint, Hello(client_nonce=b"c" * 32), timeout_s=5).msg
        proof2 = hmac.new(key, ch2.nonce + info, hashlib.sha256).digest()
        other = msgspec.msgpack.encode(_dec(port=9))
        swapped = wire.request(
            ctx, srv.endpoint, Register(info=other, nonce=ch2.nonce, client_nonce=b"c" * 32, proof=proof2), timeout_s=5
        ).msg
        assert isinstance(swapped, Rejected) and "authentication failed" in swapped.reason


def test_a_second_registration_never_displaces_a_live_pairing() -> None:
    """No "latest registration wins": every accepted registration is its own session; the first keeps
    working while its decode pings it, and a session nobody pings expires."""
    seen, gone = [], []
    with BootstrapServer(_pre(), on_pair=seen.append, on_unpair=gone.append, peer_ttl_s=1.0) as srv:
        first = register(srv.endpoint, _dec(port=7), timeout_s=5)
        assert ping(first)
        second = register(srv.endpoint, _dec(port=8), timeout_s=5)  # another decode, or a stranger
        assert [p.generation for p in seen] == [1, 2]
        assert srv.peer_for(first.session_id).info.endpoints["transfer"].endswith(":7")
        assert srv.peer_for(second.session_id).info.endpoints["transfer"].endswith(":8")
        assert ping(first) and ping(second)
        assert srv.wait_for_peer(0.1, after_generation=1).session_id == second.session_id
        assert srv.wait_for_peer(0.1, after_generation=2) is None
        # Only the first decode keeps pinging: the second session expires, the first is untouched.
        deadline = time.monotonic() + 5
        while srv.peer_for(second.session_id) is not None and time.monotonic() < deadline:
            assert ping(first)
            time.sleep(0.2)
        assert srv.peer_for(second.session_id) is None and [p.generation for p in gone] == [2]
        assert ping(first) and not ping(second)


def test_session_keys_and_sealed_messages() -> None:
    """With a secret both sides derive the same per-session key; a sealed message opens only with it."""
    with BootstrapServer(_pre(), secret="s3cret") as srv:
        pairing = register(srv.endpoint, _dec(), secret="s3cret", timeout_s=5)
        other = register(srv.endpoint, _dec(port=9), secret="s3cret", timeout_s=5)
        peer = srv.peer_for(pairing.session_id)
        assert pairing.key is not None and peer is not None and peer.key == pairing.key
        assert other.key != pairing.key  # one key per session
        frames = [b"header", b"body"]
        sealed = seal(pairing.key, frames)
        assert open_sealed(peer.key, sealed) == frames
        assert open_sealed(other.key, sealed) is None  # another session's key
        assert open_sealed(peer.key, frames) is None  # no MAC at all
        assert open_sealed(peer.key, [b"header", b"BODY", sealed[-1]]) is None  # tampered
        # A ping keeps a session alive only with its key's proof: knowing the session id is not enough.
        forged = wire.request(zmq.Context.instance(), srv.endpoint, Ping(session_id=pairing.session_id),
                              timeout_s=5).msg
        assert isinstance(forged, Pong) and not forged.paired
        assert ping(pairing)
    with BootstrapServer(_pre()) as srv:  # no secret: no key, messages pass as they are
        assert register(srv.endpoint, _dec(), timeout_s=5).key is None
        assert seal(None, frames) == frames and open_sealed(None, frames) == frames


def test_a_rejection_does_not_hand_out_the_prefill_registration() -> None:
    with BootstrapServer(_pre(), secret="s3cret") as srv:
        ctx = zmq.Context.instance()
        wire.request(ctx, srv.endpoint, Hello(client_nonce=b"c" * 32), timeout_s=5)
        bad = wire.request(ctx, srv.endpoint, Register(info=b"x", nonce=b"n" * 32, client_nonce=b"c" * 32),
                           timeout_s=5).msg
        assert isinstance(bad, Rejected) and bad.prefill is None


def test_on_pair_failure_refuses_the_decode() -> None:
    def boom(peer):
        raise ConnectionError("cannot reach decode")

    with BootstrapServer(_pre(), on_pair=boom) as srv:
        with pytest.raises(HandshakeRejected, match="could not set up the transfer"):
            register(srv.endpoint, _dec(), timeout_s=5)
        assert srv.peer is None


def test_prefill_restart_is_noticed_and_decode_repairs() -> None:
    srv = BootstrapServer(_pre()).start()
    port = srv.port
    pairing = register(srv.endpoint, _dec(), timeout_s=5)
    srv.stop()
    t0 = time.monotonic()
    with pytest.raises(wire.WireTimeout):
        ping(pairing, timeout_s=0.3, retries=2)
    assert time.monotonic() - t0 < 3.0
    with BootstrapServer(_pre(), port=port) as again:
        assert not ping(pairing)  # new epoch: the old pairing is void
        fresh = register(again.endpoint, _dec(), timeout_s=5)
        assert ping(fresh) and fresh.server_epoch != pairing.server_epoch


def test_no_prefill_is_a_bounded_timeout() -> None:
    ctx = zmq.Context.instance()
    probe = ctx.socket(zmq.ROUTER)
    port = probe.bind_to_random_port("tcp://127.0.0.1")
    probe.close(linger=0)  # a port nobody listens on
    t0 = time.monotonic()
    with pytest.raises(wire.WireTimeout, match="after 2 attempt"):
        register(f"tcp://127.0.0.1:{port}", _dec(), timeout_s=0.3, retries=2)
    assert time.monotonic() - t0 < 3.0


def test_garbage_and_vanishing_clients_do_not_hurt_the_server() -> None:
    ctx = zmq.Context.instance()
    with BootstrapServer(_pre()) as srv:
        s = wire.make_socket(ctx, zmq.DEALER)
        s.connect(srv.endpoint)
        s.send(b"\x93\xa3not a specctl header")
        env = wire.recv(s, timeout_s=5)
        assert isinstance(env.msg, Rejected) and "malformed" in env.msg.reason
        s.send_multipart(wire.encode(Hello(client_nonce=b"x")))
        wire.close_socket(s)  # vanish before the answer
        assert register(srv.endpoint, _dec(), timeout_s=5).session_id


def test_decode_in_another_process(tmp_path) -> None:
    """A real decode process pairs (exit 0); one with a different page size is refused (exit 3)."""
    script = textwrap.dedent(
        """
        import json, sys
        from specctl.engine.pd.bootstrap import HandshakeRejected, register
        from specctl.engine.cache_layout import CacheLayout
        from specctl.engine.pd.registration import build_registration
        layout = CacheLayout.from_json(json.loads(sys.argv[2]))
        info = build_registration("decode", layout, endpoints={"transfer": "tcp://127.0.0.1:7"})
        try:
            p = register(sys.argv[1], info, secret="s", timeout_s=5)
        except HandshakeRejected as e:
            print(json.dumps(e.to_json()))
            sys.exit(e.exit_code)
        print(p.session_id)
        """
    )
    with BootstrapServer(_pre(), secret="s") as srv:
        env = {**os.environ, "PYTHONWARNINGS": "error", "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
        ok = subprocess.run(
            [sys.executable, "-c", script, srv.endpoint, json.dumps(LAYOUT.to_json())],
            capture_output=True, text=True, timeout=60, env=env,
        )  # fmt: skip
        assert ok.returncode == 0, ok.stderr
        assert srv.peer is not None and srv.peer.session_id == ok.stdout.strip()
        bad = subprocess.run(
            [sys.executable, "-c", script, srv.endpoint, json.dumps({**LAYOUT.to_json(), "page_size": 32})],
            capture_output=True, text=True, timeout=60, env=env,
        )  # fmt: skip
        assert bad.returncode == 3, bad.stderr
        diff = json.loads(bad.stdout)
        assert [m["field"] for m in diff["mismatches"]] == ["page_size"]
        assert diff["mismatches"][0]["prefill"] == 16 and diff["mismatches"][0]["decode"] == 32


def test_server_thread_stops_promptly() -> None:
    srv = BootstrapServer(_pre()).start()
    t0 = time.monotonic()
    srv.stop()
    assert time.monotonic() - t0 < 2.0
    assert not any(t.name == "specctl-bootstrap" and t.is_alive() for t in threading.enumerate())


class _BuggyOnce(BootstrapServer):
    """A bootstrap whose message handling has a bug on its first message (not a malformed message: a bug)."""

    failed = False

    def _handle(self, msg):  # type: ignore[no-untyped-def]
        if not self.failed:
            self.failed = True
            raise KeyError("a bug in a check")
        return super()._handle(msg)


def test_a_bug_handling_one_message_is_refused_and_the_bootstrap_keeps_pairing(caplog) -> None:
    with _BuggyOnce(_pre()) as srv:
        with pytest.raises(HandshakeRejected, match="could not handle"):
            register(srv.endpoint, _dec(), timeout_s=5)
        assert srv.failed
        pairing = register(srv.endpoint, _dec(), timeout_s=5)  # the thread is alive: the next decode pairs
        assert pairing.session_id
    assert "KeyError" in caplog.text and "Traceback" not in caplog.text
