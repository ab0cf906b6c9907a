"""Faults of one peer cost no other user, with real `specctl serve` processes and the real router on loopback.

A decode stopped with SIGSTOP while prefill holds its rooms: every other user's request completes as usual,
prefill fails the stopped decode's rooms once its session goes quiet (not one transfer timeout each), and the
stopped decode's own requests end within the end-to-end budget (schemas/budget.py) that the router runs with.
"""

from __future__ import annotations

import http.client
import json
import signal
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from specctl.orchestrate.ports import free_ports
from specctl.schemas.budget import budget_for

from test_serve_pd import (  # isort: skip
    START_TIMEOUT,
    Proc,
    complete,
    healthy,
    info,
    models,  # noqa: F401 - the module fixture
    router_ready,
    served_model,
    wait_for,
)

pytestmark = pytest.mark.slow

TIMEOUT_S = 3.0
POOL_TOKENS = 256  # small, so the derived budget (and the test) stays short
BUDGET_S = budget_for(TIMEOUT_S, POOL_TOKENS)


def _yaml(path: Path, target: Path, ports: dict[str, int]) -> Path:
    path.write_text(f"""version: 1
name: {path.stem}
model: {{target: {target}, dtype: float32, device: cpu}}
speculative: {{algorithm: none}}
cache: {{page_size: 4, max_tokens: {POOL_TOKENS}}}
serve: {{max_batch_size: 8}}
transfer: {{backend: zmq, timeout_s: {TIMEOUT_S}}}
roles:
  prefill:
    - {{host: 127.0.0.1, port: {ports['prefill']}, bootstrap_port: {ports['bootstrap']}}}
  decode:
    - {{host: 127.0.0.1, port: {ports['decode']}}}
    - {{host: 127.0.0.1, port: {ports['decode1']}}}
  router: {{host: 127.0.0.1, port: {ports['router']}}}
""")
    return path


@pytest.fixture(scope="module")
def two_decodes(models: dict[str, Path]) -> Iterator[dict[str, Any]]:  # noqa: F811
    names = ("prefill", "bootstrap", "decode", "decode1", "router")
    ports = dict(zip(names, free_ports(len(names)), strict=True))
    root = models["root"]
    cfg = _yaml(root / "two-decodes.yaml", models["target"], ports)
    logs = root / "two-decodes-logs"
    logs.mkdir()
    hold = root / "two-decodes-faults.json"
    hold.write_text(json.dumps({"prefill_hold_s": 1.5}))  # rooms wait on prefill while the test stops a decode
    url = {r: f"http://127.0.0.1:{ports[r]}" for r in names if r != "bootstrap"}
    procs = [Proc("prefill", cfg, logs / "prefill.log", fault_plan=hold), Proc("decode", cfg, logs / "decode.log"),
             Proc("decode", cfg, logs / "decode1.log", instance=1)]
    try:
        wait_for(lambda: all(healthy(url[r]) for r in ("prefill", "decode", "decode1")), START_TIMEOUT,
                 "the roles to pair", show=procs)
        procs.append(Proc("router", cfg, logs / "router.log"))
        wait_for(lambda: router_ready(url["router"]), START_TIMEOUT, "router ready", show=procs)
        yield {"url": url, "procs": procs, "ports": ports}
    finally:
        for p in procs:
            if p.p.poll() is None:
                p.p.send_signal(signal.SIGCONT)
            p.stop()


def stream(base: str, prompt: str, out: dict[str, Any]) -> None:
    """One streaming completion; records the status, every SSE data line and the seconds it took."""
    t0 = time.monotonic()
    host, port = base.removeprefix("http://").split(":")
    conn = http.client.HTTPConnection(host, int(port), timeout=BUDGET_S + 60)
    body = {"model": served_model(base), "prompt": prompt, "max_tokens": 8, "temperature": 0, "ignore_eos": True,
            "stream": True}
    try:
        conn.request("POST", "/v1/completions", json.dumps(body), {"Content-Type": "application/json"})
        resp = conn.getresponse()
        out["status"] = resp.status
        raw = resp.read()
        out["events"] = [line[6:].decode() for line in raw.splitlines() if line.startswith(b"data: ")]
        out["body"] = raw[:2000].decode(errors="replace")
    except (OSError, http.client.HTTPException) as exc:
        out["exception"] = repr(exc)
    finally:
        out["seconds"] = time.monotonic() - t0
        conn.close()


def told_of_error(out: dict[str, Any]) -> bool:
    """Whether a request that did not complete was told why: an error status with OpenAI's error object (the
    router gave up before the stream began) or an error event in its stream."""
    if out.get("status") not in (None, 200):
        try:
            return "message" in json.loads(out["body"])["error"]
        except (ValueError, KeyError, TypeError):
            return False
    return any("message" in (json.loads(e).get("error") or {}) for e in out.get("events", []) if e != "[DONE]")


def test_a_stopped_decode_fails_its_own_requests_within_the_budget_and_costs_no_one_else(
        two_decodes: dict[str, Any]) -> None:  # fmt: skip
    url, procs = two_decodes["url"], two_decodes["procs"]
    stopped = procs[2]  # decode.1
    outs: list[dict[str, Any]] = [{} for _ in range(4)]
    threads = [threading.Thread(target=stream, args=(url["router"], f"user {i} says", outs[i])) for i in range(4)]
    for t in threads:
        t.start()
    wait_for(lambda: info(url["decode1"])["in_flight"] >= 1, 30, "a request to reach decode.1")
    stopped.p.send_signal(signal.SIGSTOP)
    t0 = time.monotonic()
    for t in threads:
        t.join(BUDGET_S + 60)
    ended = time.monotonic() - t0
    ok = [o for o in outs if o.get("status") == 200 and o.get("events", [""])[-1] == "[DONE]"
          and not any('"error"' in e for e in o["events"])]
    # The healthy decode's users finish as fast as without the fault (1.5 s held by prefill). A stopped decode's
    # user may finish too, later, when the router retries it on the healthy decode: that is no one else's cost.
    fast = [o for o in ok if o["seconds"] < 15]
    assert len(fast) >= 1, outs
    # The stopped decode's users: cut by the router at the budget, each told so (an error, never a bare close).
    assert ended <= BUDGET_S + 10, (ended, outs)  # nobody waits past the budget
    cut = [o for o in outs if o not in ok]
    assert cut, outs  # the router did not retry every one of them: the cut is what this test is about
    assert all(told_of_error(o) for o in cut), outs
    # prefill failed the stopped decode's rooms when its session went quiet, long before a timeout per room
    pre = info(url["prefill"])
    assert pre["in_flight"] == 0
    assert "stopped pinging" in procs[0].text() or "session expired" in procs[0].text()
    stopped.p.send_signal(signal.SIGCONT)


def test_a_room_whose_halves_carry_different_prompts_is_the_senders_4xx_on_both_sides(
        two_decodes: dict[str, Any]) -> None:  # fmt: skip
    url, ports = two_decodes["url"], two_decodes["ports"]
    fields = {"bootstrap_host": "127.0.0.1", "bootstrap_port": ports["bootstrap"], "bootstrap_room": 5150}
    out: dict[str, tuple[int | None, Any]] = {}
    halves = [threading.Thread(target=lambda r=r, p=p: out.__setitem__(r, complete(url[r], p, **fields)))
              for r, p in (("decode", "one prompt"), ("prefill", "another prompt"))]
    for t in halves:
        t.start()
    for t in halves:
        t.join(60)
    for role in ("decode", "prefill"):
        code, body = out[role]
        assert code == 400, (role, body)
        assert "different prompts" in body["error"]["message"], (role, body)
    assert info(url["prefill"])["in_flight"] == 0
