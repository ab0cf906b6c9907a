"""A stream the router cuts, as each router ends it: real `specctl serve` prefill and decode processes, the real
router binaries on loopback, and a decode killed (SIGKILL) while it streams an answer.

smg ends the client's stream with an error event and `[DONE]`. sglang-router closes the connection mid-stream:
no error event, no `[DONE]`, the chunked body never terminated, which validate's TOP607 (`roles.router.kind:
sglang-router`) and docs/http.md describe. If a release of sglang-router ever tells its client, this test fails
and the finding should go.
"""

from __future__ import annotations

import json
import socket
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from validate_helpers import run_cli

from specctl.orchestrate.ports import free_ports

from test_serve_pd import (  # isort: skip
    START_TIMEOUT,
    Proc,
    deployment_yaml,
    healthy,
    models,  # noqa: F401 - the module fixture
    router_ready,
    served_model,
    wait_for,
)

pytestmark = pytest.mark.slow

MAX_TOKENS = 1500  # a stream long enough to be cut in the middle (the pool holds 2048 tokens)
READ_S = 60.0  # a cut stream ends at once (the decode's socket is gone); this only bounds a broken router


@pytest.fixture(scope="module")
def prefill(models: dict[str, Path]) -> Iterator[dict[str, Any]]:  # noqa: F811
    names = ("prefill", "bootstrap", "decode", "router", "metrics")
    ports = dict(zip(names, free_ports(len(names)), strict=True))
    root = models["root"]
    cfg = deployment_yaml(root / "cut-streams.yaml", target=models["target"], draft=None, ports=ports, timeout_s=3.0)
    logs = root / "cut-streams-logs"
    logs.mkdir()
    proc = Proc("prefill", cfg, logs / "prefill.log")
    try:
        yield {"cfg": cfg, "logs": logs, "ports": ports, "proc": proc}
    finally:
        proc.stop()


def stream_and_kill(port: int, model: str, decode: Proc) -> tuple[bytes, bytes, float]:
    """Stream one completion through the router on `port`; SIGKILL `decode` once the first token arrives. Returns
    the bytes before the kill, the bytes after it, and the seconds from the kill to the end of the stream."""
    body = json.dumps({"model": model, "prompt": "def parse(path):\n", "max_tokens": MAX_TOKENS, "temperature": 0,
                       "ignore_eos": True, "stream": True}).encode()
    head = (f"POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
            f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n").encode()
    before = after = b""
    with socket.create_connection(("127.0.0.1", port), timeout=START_TIMEOUT) as s:
        s.sendall(head + body)
        while b'"text"' not in before.partition(b"\r\n\r\n")[2]:
            data = s.recv(65536)
            assert data, before  # the router closed before any token: nothing was cut mid-stream
            before += data
        decode.kill9()
        killed = time.monotonic()
        s.settimeout(READ_S)
        while not after.endswith(b"\r\n0\r\n\r\n"):  # the chunked body's end, if the router writes it
            try:
                data = s.recv(65536)
            except (TimeoutError, ConnectionResetError):
                break
            if not data:
                break
            after += data
    return before, after, time.monotonic() - killed


def events(raw: bytes) -> list[str]:
    return [line[6:].decode(errors="replace").strip() for line in raw.split(b"\n") if line.startswith(b"data: ")]


@pytest.mark.parametrize("kind", ["smg", "sglang-router"])
def test_a_killed_decodes_stream_through_each_router(prefill: dict[str, Any], kind: str) -> None:
    ports, cfg, logs = prefill["ports"], prefill["cfg"], prefill["logs"]
    decode = Proc("decode", cfg, logs / f"decode-{kind}.log")
    sets = (f"roles.router.kind={kind}", f"roles.router.metrics_port={ports['metrics']}")
    router = Proc("router", cfg, logs / f"router-{kind}.log", sets=sets)
    url = f"http://127.0.0.1:{ports['router']}"
    try:
        wait_for(lambda: healthy(f"http://127.0.0.1:{ports['decode']}"), START_TIMEOUT, "decode to pair",
                 show=(prefill["proc"], decode))
        wait_for(lambda: router_ready(url), START_TIMEOUT, f"{kind} ready", show=(router,))
        before, after, seconds = stream_and_kill(ports["router"], served_model(url), decode)
    finally:
        decode.stop()
        router.stop()
    assert before.startswith(b"HTTP/1.1 200"), before[:300]
    tail = events(after)
    assert "[DONE]" not in events(before)  # the answer was cut in the middle, not finished before the kill
    assert seconds < READ_S, (kind, after[-500:])  # the cut stream ended (it did not wait on the dead decode)
    errors = [json.loads(e)["error"] for e in tail if e != "[DONE]" and "error" in json.loads(e)]
    if kind == "smg":
        assert errors and errors[0]["message"], after[-1000:]  # the client is told its answer was cut
        assert tail[-1] == "[DONE]", tail[-3:]
    else:
        # What TOP607 says: neither an error event nor [DONE], and the chunked body is left unterminated.
        assert errors == [] and "[DONE]" not in tail, after[-1000:]
        assert not after.endswith(b"\r\n0\r\n\r\n"), after[-200:]
    # validate tells whoever picks this router, and only them.
    result = run_cli("validate", str(cfg), "--set", f"roles.router.kind={kind}", "--format", "json")
    assert result.exit_code == 0, result.output
    found = [f for f in json.loads(result.stdout)["files"][0]["findings"] if f["code"] == "TOP607"]
    if kind == "smg":
        assert found == []
    else:
        assert [f["severity"] for f in found] == ["warning"]
        assert "neither an error event nor [DONE]" in found[0]["message"] and "smg" in found[0]["fix"]
