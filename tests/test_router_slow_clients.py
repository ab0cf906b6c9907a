"""The front door closes slow clients: the real smg binary, started with the exact command `specctl up` runs
(router_argv), closes a connection that sends nothing, one that stalls inside its request head, one that
stalls inside its body (plain and chunked; answered 408 first) and an idle keep-alive connection after a
completed request, each within SLOW_CLIENT_BOUND_S. The clients are raw sockets on 127.0.0.1; the workers are
not running (these bounds hold whatever the workers do), so the router answers the completed request 503.

sglang-router has no setting for any of these (it keeps every such connection open); `up` warns when a
deployment selects it.
"""

from __future__ import annotations

import contextlib
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from specctl.orchestrate.ports import free_ports
from specctl.orchestrate.router import router_argv, router_env
from specctl.schemas.sglang.router import SLOW_CLIENT_BOUND_S
from specctl.schemas.validator import load_deployment

pytestmark = pytest.mark.slow
WAIT_S = SLOW_CLIENT_BOUND_S + 15  # how long a client waits before calling its connection "still open"
HEAD = b"POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
CLIENTS: dict[str, bytes] = {
    "idle": b"",
    "partial header": b"POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\n",
    "partial body": HEAD + b'Content-Length: 1000\r\n\r\n{"model": ',
    "partial chunked body": HEAD + b'Transfer-Encoding: chunked\r\n\r\n5\r\n{"mod\r\n',
    "idle keep-alive": b"GET /v1/models HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n",
}


@pytest.fixture
def router_port(tmp_path: Path) -> Iterator[int]:
    prefill, decode, router, bootstrap, metrics = free_ports(5)
    sets = [f"roles.prefill.port={prefill}", f"roles.prefill.bootstrap_port={bootstrap}",
            f"roles.decode.port={decode}", f"roles.router.port={router}", f"roles.router.metrics_port={metrics}"]
    argv = router_argv(load_deployment("tiny-pd", overrides=sets), python=sys.executable)
    assert argv[1:4] == ["-m", "smg", "launch"]
    log = (tmp_path / "router.log").open("wb")
    proc = subprocess.Popen(argv, env=router_env(), stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 60
        while True:
            assert proc.poll() is None, (tmp_path / "router.log").read_text(errors="replace")
            try:
                socket.create_connection(("127.0.0.1", router), timeout=1).close()
                break
            except OSError:
                assert time.monotonic() < deadline, "smg never listened"
                time.sleep(0.2)
        yield router
    finally:
        proc.terminate()
        try:
            proc.wait(20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(5)
        log.close()


def hold(port: int, sent: bytes, out: dict[str, tuple[float | None, bytes]], name: str) -> None:
    """Send `sent` (a complete request is answered first), then wait without sending: the seconds until the
    router closes the connection (None: still open after WAIT_S) and what it sent meanwhile."""
    received = b""
    with socket.create_connection(("127.0.0.1", port), timeout=5) as s:
        s.sendall(sent)
        if sent.endswith(b"\r\n\r\n"):  # a whole request: its response comes first, then the idle wait
            while b"\r\n\r\n" not in received:
                received += s.recv(65536)
        start = time.monotonic()
        s.settimeout(1.0)
        while time.monotonic() - start < WAIT_S:
            try:
                data = s.recv(65536)
            except TimeoutError:
                continue
            except OSError:
                break
            if not data:
                break
            received += data
        else:
            out[name] = (None, received)
            return
        out[name] = (time.monotonic() - start, received)


def test_smg_closes_idle_partial_header_and_partial_body_connections_within_the_bound(router_port: int) -> None:
    out: dict[str, tuple[float | None, bytes]] = {}
    threads = [threading.Thread(target=hold, args=(router_port, sent, out, name)) for name, sent in CLIENTS.items()]
    for t in threads:
        t.start()
    for t in threads:
        t.join(WAIT_S + 30)
    closed = {name: out[name][0] for name in CLIENTS}
    assert all(s is not None and s < SLOW_CLIENT_BOUND_S for s in closed.values()), closed
    for name in ("partial body", "partial chunked body"):
        assert out[name][1].startswith(b"HTTP/1.1 408"), out[name][1][:200]  # the client is told why
    assert out["idle keep-alive"][1].startswith(b"HTTP/1.1 "), out["idle keep-alive"][1][:200]


def test_smg_answers_a_body_the_engines_would_refuse_with_413(router_port: int) -> None:
    """A body over the engines' MAX_REQUEST_BYTES is the client's fault at the front door too: the router refuses
    it itself (413), instead of passing prefill's 413 on as its own 500."""
    from specctl.schemas.budget import MAX_REQUEST_BYTES

    body = b'{"model": "default", "prompt": "' + b"x" * MAX_REQUEST_BYTES + b'", "max_tokens": 4}'
    with socket.create_connection(("127.0.0.1", router_port), timeout=30) as s:
        s.sendall(HEAD + f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n".encode())
        with contextlib.suppress(OSError):  # the router may answer and close before reading it all
            s.sendall(body)
        s.settimeout(30)
        reply = b""
        with contextlib.suppress(OSError):
            while b"\r\n" not in reply:
                chunk = s.recv(65536)
                if not chunk:
                    break
                reply += chunk
    assert reply.startswith(b"HTTP/1.1 413"), reply[:200]
