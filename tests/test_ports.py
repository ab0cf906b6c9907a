"""Free ports for launched servers come from below the kernel's ephemeral range (orchestrate/ports.py), where
no outgoing connection's source port can take them between the choice and the server's bind."""

from __future__ import annotations

import socket

import pytest

from specctl.bench.ab import port_overrides
from specctl.orchestrate import ports


def test_a_free_port_is_below_the_ephemeral_range_and_bindable():
    hi = ports.ephemeral_start()
    for _ in range(20):
        port = ports.free_port()
        assert ports.PORT_FLOOR <= port < hi
        with socket.socket() as s:
            s.bind(("127.0.0.1", port))
            s.listen()


def test_a_set_of_ports_is_distinct_and_below_the_ephemeral_range(monkeypatch: pytest.MonkeyPatch):
    got = ports.free_ports(8)
    assert len(got) == len(set(got)) == 8
    assert all(ports.PORT_FLOOR <= p < ports.ephemeral_start() for p in got)
    # a window of exactly three free ports: all three, each once, however the draws fall
    base = ports.free_port()
    monkeypatch.setattr(ports, "PORT_FLOOR", base)
    monkeypatch.setattr(ports, "ephemeral_start", lambda: base + 3)
    with socket.socket() as a, socket.socket() as b:
        try:
            a.bind(("127.0.0.1", base + 1))
            b.bind(("127.0.0.1", base + 2))
        except OSError:
            pytest.skip(f"port {base + 1} or {base + 2} is busy on this machine")
    assert sorted(ports.free_ports(3)) == [base, base + 1, base + 2]


def test_a_port_something_listens_on_or_a_taken_one_is_never_handed_out(monkeypatch: pytest.MonkeyPatch):
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        p = busy.getsockname()[1]
        # a three-port window: the listening one, one the caller already holds, and the free one
        monkeypatch.setattr(ports, "PORT_FLOOR", p - 1)
        monkeypatch.setattr(ports, "ephemeral_start", lambda: p + 2)
        with socket.socket() as probe:
            try:
                probe.bind(("127.0.0.1", p + 1))
            except OSError:
                pytest.skip(f"port {p + 1} is busy on this machine")
        for _ in range(10):
            assert ports.free_port(taken={p - 1}) == p + 1


def test_ab_variants_get_distinct_ports_below_the_ephemeral_range():
    raw = {"roles": {"router": {"port": 8000, "metrics_port": 9000},
                     "prefill": {"port": 8100, "bootstrap_port": 8998}, "decode": {"port": 8200}}}
    sets = port_overrides(raw)
    got = {s.split("=", 1)[0]: int(s.split("=", 1)[1]) for s in sets}
    assert set(got) == {"roles.router.port", "roles.router.metrics_port", "roles.prefill.port",
                        "roles.prefill.bootstrap_port", "roles.decode.port"}
    assert len(set(got.values())) == len(got)
    assert all(ports.PORT_FLOOR <= v < ports.ephemeral_start() for v in got.values())
