"""Pairing nobody can hijack: a stranger that registers with prefill's bootstrap while a pair serves through
the real router (smg) gets nothing and costs no client request; with a shared secret it cannot pair at all,
and control messages without the session's MAC are refused, never acted on.

The attacker is what the issue measured: a local process that builds a registration matching the deployment
(from the same model files) with a transfer endpoint of its own, and re-registers every 0.2 s.
"""

from __future__ import annotations

import threading
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import zmq

from specctl.engine.config import EngineConfig
from specctl.engine.engine import Engine
from specctl.engine.pd import wire
from specctl.engine.pd.bootstrap import HandshakeRejected, register, seal
from specctl.engine.pd.messages import PdClaim
from specctl.engine.pd.registration import build_registration
from specctl.orchestrate.ports import free_ports
from specctl.schemas.role_config import RoleConfig

from test_serve_pd import (  # isort: skip
    PROMPTS,
    START_TIMEOUT,
    Proc,
    complete,
    concurrent,
    deployment_yaml,
    healthy,
    info,
    models,  # noqa: F401 - the module fixture
    offline,  # noqa: F401 - the module fixture
    router_ready,
    wait_for,
)

pytestmark = pytest.mark.slow

SECRET_ENV = "SPECCTL_TEST_PD_SECRET"


def _topology(dirs: dict[str, Path], name: str, *, secret: str | None) -> Iterator[dict[str, Any]]:
    ports = dict(zip(("prefill", "decode", "router", "bootstrap"), free_ports(4), strict=True))
    cfg = deployment_yaml(dirs["root"] / f"{name}.yaml", target=dirs["target"], draft=None, ports=ports,
                          timeout_s=3, secret_env=SECRET_ENV if secret else None)
    logs = dirs["root"] / f"{name}-logs"
    logs.mkdir()
    env = {SECRET_ENV: secret} if secret else {}
    t: dict[str, Any] = {"cfg": cfg, "ports": ports,
                         "url": {r: f"http://127.0.0.1:{ports[r]}" for r in ("prefill", "decode", "router")}}
    procs = [Proc("prefill", cfg, logs / "prefill.log", env=env), Proc("decode", cfg, logs / "decode.log", env=env)]
    try:
        wait_for(lambda: healthy(t["url"]["prefill"]) and healthy(t["url"]["decode"]), START_TIMEOUT, "pair ready")
        procs.append(Proc("router", cfg, logs / "router.log", env=env))
        wait_for(lambda: router_ready(t["url"]["router"]), START_TIMEOUT, "router ready")
        t["procs"] = procs
        yield t
    finally:
        for p in procs:
            p.stop()


@pytest.fixture(scope="module")
def open_pair(models: dict[str, Path]) -> Iterator[dict[str, Any]]:  # noqa: F811
    yield from _topology(models, "open-pd", secret=None)


@pytest.fixture(scope="module")
def secret_pair(models: dict[str, Path]) -> Iterator[dict[str, Any]]:  # noqa: F811
    yield from _topology(models, "secret-pd", secret="correct horse battery staple")


class Attacker:
    """A matching registration with its own transfer endpoint, re-registering every 0.2 s; counts what the
    endpoint receives."""

    def __init__(self, dirs: dict[str, Path], bootstrap_port: int, *, secret: str | None = None) -> None:
        role = {"model": {"target": str(dirs["target"]), "dtype": "float32", "device": "cpu"},
                "cache": {"page_size": 4, "max_tokens": 2048}, "serve": {"max_batch_size": 8}}
        engine = Engine(EngineConfig.from_role(RoleConfig.from_json(role)))
        self.ctx = zmq.Context()
        self.sink = self.ctx.socket(zmq.ROUTER)
        self.sink.setsockopt(zmq.LINGER, 0)
        self.sink.bind("tcp://127.0.0.1:0")
        endpoint = self.sink.getsockopt_string(zmq.LAST_ENDPOINT)
        self.info = build_registration("decode", engine.runner.layout(), speculative=engine.config.speculative,
                                       transfer_backend="zmq", endpoints={"transfer": endpoint},
                                       facts=engine.runner.facts)
        self.bootstrap = f"tcp://127.0.0.1:{bootstrap_port}"
        self.secret = secret
        self.accepted = 0
        self.refused: list[str] = []
        self.received = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                register(self.bootstrap, self.info, secret=self.secret, timeout_s=2, retries=1, ctx=self.ctx)
                self.accepted += 1
            except HandshakeRejected as exc:
                self.refused.append(exc.reason)
            while self.sink.poll(200, zmq.POLLIN):  # anything sent to the impostor's transfer endpoint
                self.sink.recv_multipart()
                self.received += 1

    def __enter__(self) -> Attacker:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(10)
        self.sink.close(0)
        self.ctx.term()


def test_a_stranger_registering_while_a_pair_serves_gets_nothing_and_costs_no_request(
    open_pair: dict[str, Any], models: dict[str, Path], offline: dict[str, list[int]]  # noqa: F811
) -> None:
    with Attacker(models, open_pair["ports"]["bootstrap"]) as attacker:
        wait_for(lambda: attacker.accepted >= 2, 30, "the attacker to register")
        results = [concurrent(open_pair["url"]["router"], PROMPTS[:4]) for _ in range(3)]  # 12 requests
        wait_for(lambda: attacker.accepted >= 5, 30, "the attacker to keep registering")
    for batch in results:
        for prompt, (code, body) in batch.items():
            assert code == 200, body
            assert body["choices"][0]["token_ids"] == offline[prompt]
    assert attacker.received == 0  # not one byte of anyone's KV
    assert attacker.accepted >= 5  # the registrations were accepted: they simply displace nobody
    assert healthy(open_pair["url"]["decode"])
    assert "registration" not in info(open_pair["url"]["decode"])


def test_with_a_secret_a_stranger_cannot_pair_and_unauthenticated_control_messages_are_refused(
    secret_pair: dict[str, Any], models: dict[str, Path], offline: dict[str, list[int]]  # noqa: F811
) -> None:
    with Attacker(models, secret_pair["ports"]["bootstrap"]) as attacker:
        wait_for(lambda: len(attacker.refused) >= 2, 30, "the attacker to be refused")
        results = concurrent(secret_pair["url"]["router"], PROMPTS[:3])
    assert attacker.accepted == 0 and all("authentication required" in r for r in attacker.refused)
    for prompt, (code, body) in results.items():
        assert code == 200, body  # the pair's own control and transfer messages are sealed and flow
        assert body["choices"][0]["token_ids"] == offline[prompt]
    pre = info(secret_pair["url"]["prefill"])["bootstrap"]
    assert pre["authenticated"] and pre["sessions"] == 1
    before = pre["auth_failures"]
    # Straight to prefill's control socket: a claim for a made-up session, unsealed and wrongly sealed.
    ctx = zmq.Context()
    sock = ctx.socket(zmq.DEALER)
    sock.setsockopt(zmq.LINGER, 0)
    sock.connect(pre["control"])
    try:
        claim = [bytes(f) for f in wire.encode(PdClaim(req_id="room-1", prompt_ids=[1, 2, 3],
                                                       pairing_id="0" * 32))]
        sock.send_multipart(claim)
        sock.send_multipart(seal(b"k" * 32, claim))
        assert not sock.poll(1500, zmq.POLLIN)  # no answer at all: nothing acted on
    finally:
        sock.close(0)
        ctx.term()
    wait_for(lambda: info(secret_pair["url"]["prefill"])["bootstrap"]["auth_failures"] >= before + 2, 10,
             "prefill to count the refused messages")
    assert info(secret_pair["url"]["prefill"])["in_flight"] == 0
    code, body = complete(secret_pair["url"]["router"], PROMPTS[0])
    assert code == 200 and body["choices"][0]["token_ids"] == offline[PROMPTS[0]]


def test_replayed_sealed_claims_and_pings_are_dropped_and_counted_and_a_vanished_peer_logs_no_traceback(
    secret_pair: dict[str, Any], models: dict[str, Path]  # noqa: F811
) -> None:
    """What a capture of the real session's traffic buys: nothing. Each sealed message carries the session's
    counter, so a replayed claim creates no room and a replayed ping keeps nothing alive; both are counted."""
    from specctl.engine.pd.bootstrap import _ping
    from specctl.engine.pd.messages import PdProgress

    secret = "correct horse battery staple"
    with Attacker(models, secret_pair["ports"]["bootstrap"], secret=secret) as peer:
        pairing = register(peer.bootstrap, peer.info, secret=secret, timeout_s=5, retries=1, ctx=peer.ctx)
    prefill = secret_pair["url"]["prefill"]
    control = info(prefill)["bootstrap"]["control"]
    ctx = zmq.Context()
    sock = ctx.socket(zmq.DEALER)
    sock.setsockopt(zmq.LINGER, 0)
    sock.connect(control)
    try:
        claim = pairing.control.seal([bytes(f) for f in wire.encode(PdClaim(
            req_id="room-4242", prompt_ids=[1, 2, 3], pairing_id=pairing.session_id))])
        sock.send_multipart(claim)
        assert sock.poll(5000, zmq.POLLIN)
        body = pairing.control.open(sock.recv_multipart())
        assert body is not None and wire.decode(body).msg == PdProgress(req_id="room-4242", stage="queued")
        for _ in range(20):
            sock.send_multipart(claim)  # the captured claim, replayed
        assert not sock.poll(1500, zmq.POLLIN)  # nothing answered, nothing acted on
        ping = _ping(pairing)
        for _ in range(2):  # the captured ping, replayed once
            wire.request(ctx, pairing.endpoint, ping, timeout_s=5, retries=1)
    finally:
        sock.close(0)  # the claim's room expires (transfer.timeout_s): prefill answers a peer that is gone
        ctx.term()
    pre = info(prefill)
    assert pre["bootstrap"]["rejected_by_reason"]["stale"] == 20
    assert pre["bootstrap"]["rejected_by_reason"]["bootstrap_stale"] == 1
    assert pre["in_flight"] <= 1  # the one room the real claim opened, never 21
    wait_for(lambda: info(prefill)["in_flight"] == 0, 15, "the unclaimed room to expire")
    time.sleep(0.5)
    log = secret_pair["procs"][0].text()
    assert "never retrieved" not in log and "Traceback" not in log, log[-3000:]
    with urllib.request.urlopen(prefill + "/metrics", timeout=10) as r:
        metrics = r.read().decode()
    assert 'specctl_pd_rejected_total{model_name=' in metrics and 'reason="stale"} 20' in metrics
    code, body = complete(secret_pair["url"]["router"], PROMPTS[0])
    assert code == 200, body


def test_a_stranger_whose_transfer_endpoint_never_acknowledges_stalls_only_its_own_rooms(
    open_pair: dict[str, Any], models: dict[str, Path], offline: dict[str, list[int]]  # noqa: F811
) -> None:
    """Without a secret a local process may pair; its rooms' KV goes to an endpoint that never acknowledges.
    Prefill sends each session's rooms on their own lane, so every real user is served as if it were not there."""
    attacker = Attacker(models, open_pair["ports"]["bootstrap"])
    pairing = register(attacker.bootstrap, attacker.info, timeout_s=5, retries=1, ctx=attacker.ctx)
    prefill = open_pair["url"]["prefill"]
    sock = attacker.ctx.socket(zmq.DEALER)
    sock.setsockopt(zmq.LINGER, 0)
    sock.connect(info(prefill)["bootstrap"]["control"])
    rooms = list(range(9100, 9106))
    stranger_halves: list[tuple[int | None, Any]] = []
    try:
        for room in rooms:
            sock.send_multipart(pairing.control.seal([bytes(f) for f in wire.encode(PdClaim(
                req_id=f"room-{room}", prompt_ids=[5, 6, 7, 8],
                pairing_id=pairing.session_id))]))
        halves = [threading.Thread(target=lambda r=r: stranger_halves.append(complete(
            prefill, [5, 6, 7, 8], bootstrap_host="127.0.0.1", bootstrap_port=open_pair["ports"]["bootstrap"],
            bootstrap_room=r))) for r in rooms]
        for t in halves:
            t.start()
        wait_for(lambda: attacker.sink.poll(0, zmq.POLLIN) or len(stranger_halves) == len(rooms), 30,
                 "prefill to start sending the stranger's KV")
        assert not stranger_halves, stranger_halves
        t0 = time.monotonic()
        results = concurrent(open_pair["url"]["router"], PROMPTS[:4])
        for t in halves:
            t.join(60)
    finally:
        sock.close(0)
        attacker.sink.close(0)
        attacker.ctx.term()
    for prompt, (code, body) in results.items():
        assert code == 200, body
        assert body["choices"][0]["token_ids"] == offline[prompt]
        assert body["timings"]["prefill_wait_s"] < 3.0, body["timings"]  # nobody queued behind the stranger
    assert time.monotonic() - t0 < 30
    assert len(stranger_halves) == len(rooms) and all(code != 200 for code, _ in stranger_halves)
    wait_for(lambda: info(prefill)["in_flight"] == 0, 15, "prefill to drop the stranger's rooms")
