"""Transfer backends (zmq over tcp and ipc, shm): exact round trips, the receiver's check against the
registration (each field a distinct, named failure on both ends), pipelining, shm segment lifetime."""

from __future__ import annotations

import os
import socket
import threading
from dataclasses import replace

import msgspec
import pytest
import torch
import zmq

from specctl.engine.cache_layout import CacheLayout
from specctl.engine.pd import wire
from specctl.engine.pd.messages import PrefillResult
from specctl.engine.pd.registration import build_registration
from specctl.engine.pd.transfer import (
    PayloadSpec,
    ShmPayload,
    TransferAck,
    TransferError,
    TransferHeader,
    TransferReceiver,
    TransferSender,
    TransferTimeout,
    canonical_order,
    cleanup_stale_segments,
    shm_dir,
)
from specctl.schemas.role_config import SpeculativeConfig

# The runner's layout convention (engine/cache.py): kv pages per full layer; mamba = conv + ssm.
LAYOUT_JSON = {
    "page_size": 16,
    "dtype": "float32",
    "kv_item_lens": [2 * 16 * 2 * 64 * 4],  # one page of k+v of the one full layer
    "state_types": ["mamba", "swa"],
    "state_item_lens": [1 * 32 * 3 * 4 + 1 * 2 * 8 * 4 * 4, 2 * 2 * 8 * 2 * 64 * 4],
    "state_dims": [[1, 32, 3, 2, 8, 4], [2, 2, 8, 2, 64]],
    "weights_hash": "abc",
    "architecture": "SpecctlHybridForCausalLM",
    "layer_kinds": ["mamba", "swa", "full", "swa"],
    "vocab_size": 260,
    "shapes": {"num_key_value_heads": 2, "head_dim": 64, "sliding_window": 8},
}
DRAFT_LAYOUT_JSON = {
    **LAYOUT_JSON,
    "kv_item_lens": [2 * 16 * 1 * 64 * 4],
    "state_types": [],
    "state_item_lens": [],
    "state_dims": [],
    "layer_kinds": ["full"],
    "shapes": {"num_key_value_heads": 1, "head_dim": 64},
}
LAYOUT = CacheLayout.from_json(LAYOUT_JSON)
DRAFT_LAYOUT = CacheLayout.from_json(DRAFT_LAYOUT_JSON)


def _spec() -> PayloadSpec:
    spec = SpeculativeConfig(algorithm="draft")
    info = build_registration("decode", LAYOUT, draft_layout=DRAFT_LAYOUT, speculative=spec)
    return PayloadSpec.from_registration(info)


def _pages(n: int) -> int:
    return -(-n // 16)


def _payload(length: int, seed: int = 0, dtype=torch.float32, draft_length: int | None = None) -> dict:
    """Tensors in the runner's export order (kv, swa, mamba_conv, mamba_ssm, draft.kv)."""
    g = torch.Generator().manual_seed(seed)
    dl = length if draft_length is None else draft_length
    return {
        "kv": torch.randn(1, 2, _pages(length), 16, 2, 64, generator=g).to(dtype),
        "swa": torch.randn(2, 2, 8, 2, 64, generator=g).to(dtype),
        "mamba_conv": torch.randn(1, 32, 3, generator=g).to(dtype),
        "mamba_ssm": torch.randn(1, 2, 8, 4, generator=g),
        "draft.kv": torch.randn(1, 2, _pages(dl), 16, 1, 64, generator=g).to(dtype),
    }


@pytest.fixture(params=["tcp", "ipc", "shm"])
def link(request, tmp_path):
    backend = "shm" if request.param == "shm" else "zmq"
    bind = f"ipc://{tmp_path}/rx.sock" if request.param == "ipc" else "tcp://127.0.0.1:0"
    rx = TransferReceiver(_spec(), bind=bind, timeout_s=10, backend=backend)
    tx = TransferSender(rx.endpoint, backend=backend, timeout_s=10)
    yield tx, rx
    tx.close()
    rx.close()


def _serve(rx: TransferReceiver, n: int, out: dict) -> threading.Thread:
    """Receive n payloads in a thread; keep copies (and errors) in `out`."""

    def run() -> None:
        for _ in range(n):
            try:
                with rx.recv(timeout_s=10) as p:
                    out[p.request_id] = ({k: v.clone() for k, v in p.tensors.items()}, p.length, p.result)
            except TransferError as exc:
                out.setdefault("errors", []).append(exc)
        rx.flush()

    th = threading.Thread(target=run)
    th.start()
    return th


def test_spec_from_registration_names_and_sizes() -> None:
    spec = _spec()
    assert spec.names == ["kv", "mamba_conv", "mamba_ssm", "swa", "draft.kv"]
    kv = spec.components[0]
    assert kv.expected_shape(17) == (1, 2, 2, 16, 2, 64) and kv.expected_shape(16) == (1, 2, 1, 16, 2, 64)
    assert spec.components[2].dtype == "float32" and spec.components[2].expected_shape(99) == (1, 2, 8, 4)
    assert spec.components[4].draft
    assert list(canonical_order(_payload(3))) == spec.names  # the runner's order is put right by the sender


def test_generic_state_component_without_the_runner_convention() -> None:
    lay = replace(LAYOUT, state_types=("mamba",), state_item_lens=(64,), state_dims=((4, 4),))
    spec = PayloadSpec.from_registration(build_registration("decode", lay))
    assert spec.names == ["kv", "mamba"]
    metas = [wire.TensorMeta("kv", "float32", (1, 2, 1, 16, 2, 64)), wire.TensorMeta("mamba", "float32", (4, 4))]
    assert spec.problems(5, metas) == []
    metas[1] = wire.TensorMeta("mamba", "float32", (4, 5))
    assert [f for f, _ in spec.problems(5, metas)] == ["mamba.shape"]


@pytest.mark.slow
def test_real_runner_export_matches_its_registration() -> None:
    """The oracle: live ModelRunners' exports (target + draft, as prefill sends them) pass the spec
    built from their layout(), and the tensors survive a real transfer into a second runner."""
    from specctl.engine.model_runner import ForwardItem, ModelRunner

    kw = dict(page_size=16, max_tokens=512, max_requests=2)
    runner = ModelRunner("builtin:tiny-hybrid", **kw)
    draft = ModelRunner("builtin:tiny-draft", **kw)
    info = build_registration(
        "decode", runner.layout(), speculative=SpeculativeConfig(algorithm="draft", num_steps=3),
        draft_layout=draft.layout(), facts=runner.facts, draft_facts=draft.facts,
    )  # fmt: skip
    spec = PayloadSpec.from_registration(info)
    assert spec.names == ["kv", "mamba_conv", "mamba_ssm", "swa", "draft.kv"]
    runner.allocate(1, 37)
    runner.forward([ForwardItem(1, list(range(37)), 0)])
    draft.allocate(1, 36)
    draft.forward([ForwardItem(1, list(range(36)), 0)])
    tensors = {**runner.export_request(1), **{f"draft.{k}": v for k, v in draft.export_request(1).items()}}
    tensors = canonical_order(tensors)
    metas = [wire.TensorMeta(k, str(v.dtype).removeprefix("torch."), tuple(v.shape)) for k, v in tensors.items()]
    assert spec.problems(37, metas, draft_length=36) == []
    assert spec.problems(48, metas, draft_length=36) == []  # 48 tokens still fit the same 3 pages
    assert [f for f, _ in spec.problems(49, metas, draft_length=36)] == ["kv.shape"]  # one page more expected
    assert [f for f, _ in spec.problems(37, metas, draft_length=60)] == ["draft.kv.shape"]

    # through a real socket into a fresh runner: its cache then holds exactly what prefill had
    other = ModelRunner("builtin:tiny-hybrid", **kw)
    with TransferReceiver(spec, timeout_s=10) as rx, TransferSender(rx.endpoint, timeout_s=10) as tx:
        tx.submit("real", tensors, length=37, result=PrefillResult(first_token=5, draft_length=36))
        with rx.recv() as payload:
            target = {k: v for k, v in payload.tensors.items() if not k.startswith("draft.")}
            other.import_request(7, target, payload.length)
        assert tx.collect(10.0, request_id="real")[0].error is None
    again = other.export_request(7)
    for k, v in runner.export_request(1).items():
        assert torch.equal(again[k], v), k


def test_round_trip_is_exact(link) -> None:
    tx, rx = link
    out: dict = {}
    th = _serve(rx, 3, out)
    lengths = {f"r{i}": 5 + 13 * i for i in range(3)}
    sent = {rid: _payload(n, seed=i) for i, (rid, n) in enumerate(lengths.items())}
    for rid, tensors in sent.items():
        result = PrefillResult(first_token=42, rng_state=rid.encode(), draft_length=lengths[rid], queue_s=0.25,
                               compute_s=0.5, sent_at=1.0)
        res = tx.send(rid, tensors, length=lengths[rid], result=result)
        assert res.error is None and res.nbytes == sum(t.numel() * 4 for t in tensors.values())
    th.join(10)
    assert "errors" not in out
    for rid, tensors in sent.items():
        got, length, result = out[rid]
        assert length == lengths[rid]
        assert result == PrefillResult(first_token=42, rng_state=rid.encode(), draft_length=lengths[rid],
                                       queue_s=0.25, compute_s=0.5, sent_at=1.0)
        assert list(got) == list(canonical_order(tensors))
        for k in tensors:
            assert torch.equal(got[k], tensors[k]), (rid, k)


# (case, how to break a good payload, field named in the error)
BAD = [
    ("missing component", lambda p: {k: v for k, v in p.items() if k != "swa"}, "components"),
    ("extra component", lambda p: {**p, "bogus": torch.zeros(1)}, "components"),
    ("dtype", lambda p: {**p, "mamba_conv": p["mamba_conv"].to(torch.bfloat16)}, "mamba_conv.dtype"),
    ("ssm kept in float32", lambda p: {**p, "mamba_ssm": p["mamba_ssm"].to(torch.float16)}, "mamba_ssm.dtype"),
    ("kv pages", lambda p: {**p, "kv": p["kv"][:, :, :-1].contiguous()}, "kv.shape"),
    ("kv heads", lambda p: {**p, "kv": p["kv"][..., :1, :].contiguous()}, "kv.shape"),
    ("state shape", lambda p: {**p, "swa": p["swa"].reshape(2, 2, 16, 1, 64)}, "swa.shape"),
    ("draft length", lambda p: {**p, "draft.kv": torch.cat([p["draft.kv"]] * 2, dim=2)}, "draft.kv.shape"),
]


@pytest.mark.parametrize(("breaker", "field"), [b[1:] for b in BAD], ids=[b[0] for b in BAD])
def test_mismatched_payload_fails_that_request_on_both_ends(link, breaker, field) -> None:
    tx, rx = link
    out: dict = {}
    th = _serve(rx, 2, out)
    with pytest.raises(TransferError) as err:
        tx.send("bad-1", breaker(_payload(10)), length=10, result=PrefillResult(first_token=1, draft_length=10))
    assert err.value.request_id == "bad-1" and err.value.field == field
    assert "bad-1" in str(err.value)
    # the link stays usable: the next request goes through
    tx.send("good-2", _payload(10, seed=3), length=10)
    th.join(10)
    (rx_err,) = out["errors"]
    assert rx_err.request_id == "bad-1" and rx_err.field == field
    assert "good-2" in out


def test_receiver_checks_order_and_draft_length() -> None:
    """Order as it arrives (a raw sender, no canonical ordering) and the draft's own length."""
    with TransferReceiver(_spec(), timeout_s=5) as rx:
        s = wire.make_socket(zmq.Context.instance(), zmq.DEALER)
        s.connect(rx.endpoint)
        try:
            p = _payload(20, draft_length=40)
            order = ["kv", "swa", "mamba_conv", "mamba_ssm", "draft.kv"]  # the runner's own dict order
            wire.send(s, TransferHeader(request_id="o", length=20, components=order), p, timeout_s=5)
            with pytest.raises(TransferError, match="different order") as err:
                rx.recv()
            assert err.value.field == "components"
            good = canonical_order(p)
            hdr = TransferHeader(request_id="d", length=20, components=list(good),
                                 result=PrefillResult(first_token=3, draft_length=40))
            wire.send(s, hdr, good, timeout_s=5)
            with rx.recv() as got:
                assert got.request_id == "d" and got.result is not None and got.result.draft_length == 40
            hdr = TransferHeader(request_id="d2", length=20, components=list(good))  # no result: draft as long
            wire.send(s, hdr, good, timeout_s=5)
            with pytest.raises(TransferError) as err:
                rx.recv()
            assert err.value.field == "draft.kv.shape" and err.value.request_id == "d2"
        finally:
            wire.close_socket(s)


def test_pipelined_submit_and_collect(link) -> None:
    tx, rx = link
    out: dict = {}
    th = _serve(rx, 6, out)
    for i in range(6):
        tx.submit(f"p{i}", _payload(4, seed=i), length=4)
    done = []
    while len(done) < 6:
        got = tx.collect(10.0)
        assert got, "no outcome within the timeout"
        done += got
    th.join(10)
    assert sorted(r.request_id for r in done) == [f"p{i}" for i in range(6)]
    assert all(r.error is None for r in done) and tx.pending == 0
    with pytest.raises(TransferError, match="already in flight"):
        tx.submit("x", _payload(1), length=1)
        tx.submit("x", _payload(1), length=1)


def test_receiver_timeout_names_no_request() -> None:
    with TransferReceiver(_spec(), timeout_s=0.2) as rx:
        with pytest.raises(TransferTimeout) as err:
            rx.recv()
        assert err.value.request_id is None


def test_send_without_a_receiver_times_out() -> None:
    # Hold the port with a plain TCP listener that never speaks ZMTP: no receiver ever answers, and
    # (unlike a closed port) no other process can take the port while the test runs.
    with socket.create_server(("127.0.0.1", 0)) as silent:
        port = silent.getsockname()[1]
        with TransferSender(f"tcp://127.0.0.1:{port}", timeout_s=0.5) as tx:
            with pytest.raises(TransferTimeout) as err:
                tx.send("lonely", _payload(2), length=2)
            assert err.value.request_id == "lonely"


def _my_segments() -> set[str]:
    return {n for n in os.listdir(shm_dir()) if n.startswith(f"specctl-shm-{os.getpid()}-")}


def test_shm_segments_are_reused_and_removed_on_close() -> None:
    before = _my_segments()
    with TransferReceiver(_spec(), timeout_s=10, backend="shm") as rx:
        tx = TransferSender(rx.endpoint, backend="shm", timeout_s=10)
        out: dict = {}
        th = _serve(rx, 5, out)
        for i in range(5):
            tx.send(f"s{i}", _payload(16, seed=i), length=16)
            assert tx.wait_released(5.0)
        th.join(10)
        assert len(_my_segments() - before) == 1  # one segment, handed back and reused each time
        tx.close()
    assert _my_segments() == before


def test_shm_receiver_refuses_foreign_segment_names(tmp_path) -> None:
    """A control message naming an arbitrary file is refused, never opened."""
    victim = tmp_path / "secret"
    victim.write_bytes(b"x" * 64)
    with TransferReceiver(None, timeout_s=5, backend="shm") as rx:
        s = wire.make_socket(zmq.Context.instance(), zmq.DEALER)
        s.connect(rx.endpoint)
        meta = wire.TensorMeta("kv.0", "uint8", (64,))
        msg = ShmPayload(
            request_id="evil", length=1, components=["kv.0"], segment=f"../../{victim}", metas=[meta], offsets=[0]
        )
        wire.send(s, msg, timeout_s=5)
        with pytest.raises(TransferError) as err:
            rx.recv()
        assert err.value.field == "segment" and err.value.request_id == "evil"
        ack = wire.recv(s, timeout_s=5).msg
        assert not ack.ok and ack.field == "segment"
        wire.close_socket(s)


def test_cleanup_removes_segments_of_dead_processes() -> None:
    dead_pid = 2**22 + 12345  # above the default pid_max: never alive
    name = f"specctl-shm-{dead_pid}-0123456789ab-1048576"
    path = os.path.join(shm_dir(), name)
    with open(path, "wb") as f:
        f.write(b"\0")
    mine = _my_segments()
    assert cleanup_stale_segments() >= 1
    assert not os.path.exists(path)
    assert _my_segments() == mine


def test_header_and_payload_structs_are_msgpack_only() -> None:
    enc = wire.encode(ShmPayload(request_id="r", length=0, components=[], segment="s", metas=[], offsets=[]))
    assert msgspec.msgpack.decode(enc[0])[0] == "specctl"


def _deleted_segment_mappings() -> int:
    with open("/proc/self/maps") as f:
        return sum(1 for line in f if "specctl-shm-" in line and "(deleted)" in line)


@pytest.mark.skipif(not os.path.exists("/proc/self/maps"), reason="needs /proc")
def test_receiver_unmaps_segments_a_sender_abandoned() -> None:
    """After a sender goes away (segments unlinked), the receiver drops its mappings of them, so the
    shared memory is really returned."""
    with TransferReceiver(_spec(), timeout_s=10, backend="shm") as rx:
        for i in range(2):
            out: dict = {}
            th = _serve(rx, 1, out)
            with TransferSender(rx.endpoint, backend="shm", timeout_s=10) as tx:
                tx.send(f"gen{i}", _payload(16, seed=i), length=16)
                th.join(10)
                assert tx.wait_released(5.0)
        # the first sender's segment was unlinked on close and unmapped when the second one's arrived
        assert _deleted_segment_mappings() <= 1


@pytest.mark.parametrize("backend", ["zmq", "shm"])
def test_with_keys_only_the_claiming_sessions_mac_opens_a_payload(backend: str) -> None:
    """Shared secret: the receiver looks up the key of the session that claimed each request; a payload
    with that session's MAC round-trips exactly (acks and shm releases are MAC'd back), one without a MAC,
    with another session's, or for an unclaimed request is dropped unanswered and counted."""
    good, other = b"g" * 32, b"o" * 32
    claimed = {"r-good": good, "r-other": good}
    rx = TransferReceiver(_spec(), timeout_s=10, auth=claimed.get, backend=backend)
    senders = {name: TransferSender(rx.endpoint, backend=backend, timeout_s=1.5, key=key)
               for name, key in (("good", good), ("other", other), ("none", None))}
    out: dict = {}
    th = _serve(rx, 1, out)
    try:
        tensors = _payload(20, seed=3)
        with pytest.raises(TransferTimeout):
            senders["none"].send("r-good", tensors, length=20)  # no MAC: never acknowledged
        with pytest.raises(TransferTimeout):
            senders["other"].send("r-other", tensors, length=20)  # another session's key
        with pytest.raises(TransferTimeout):
            senders["good"].send("r-unclaimed", tensors, length=20)  # nobody claimed it
        res = senders["good"].send("r-good", tensors, length=20, timeout_s=10)
        assert res.error is None
        th.join(10)
        got, length, _ = out["r-good"]
        assert length == 20 and all(torch.equal(got[k], tensors[k]) for k in tensors)
        assert set(out) == {"r-good"} and rx.auth_failures == 3
        if backend == "shm":
            assert senders["good"].wait_released(5)  # the MAC'd release came back and was accepted
    finally:
        for tx in senders.values():
            tx.close()
        rx.close()


def test_a_forged_ack_is_not_acted_on() -> None:
    key = b"k" * 32
    ctx = zmq.Context.instance()
    fake = ctx.socket(zmq.ROUTER)
    fake.setsockopt(zmq.LINGER, 0)
    fake.bind("tcp://127.0.0.1:0")
    tx = TransferSender(fake.getsockopt_string(zmq.LAST_ENDPOINT), timeout_s=1.0, key=key)
    try:
        tx.submit("r1", _payload(4), length=4)
        identity = fake.recv_multipart()[0]
        ack = wire.encode(TransferAck(request_id="r1", ok=True))
        fake.send_multipart([identity, *ack])  # unsealed: ignored
        fake.send_multipart([identity, *ack, b"x" * 32])  # wrong MAC: ignored
        res = tx.collect(3.0, request_id="r1")
        assert res and isinstance(res[0].error, TransferTimeout) and tx.auth_failures == 2
    finally:
        tx.close()
        fake.close(0)
