"""Disaggregated serving end to end through the real router (smg, the default; sglang-router in one test):
real `specctl serve` / `specctl up` processes on loopback, SGLang's disaggregation protocol over HTTP, real
ZMQ and the router binary.

Oracles: greedy output through the router -> (prefill AND decode, one bootstrap room) equals the offline
Engine's output token for token (the colocated server equals the offline Engine, tests/test_serve_http.py),
with and without adaptive draft speculation on decode, for concurrent requests over 2 prefill + 2 decode
instances of a hybrid model (mamba + swa state cross the wire); a mismatched decode is refused with the
differing fields, exits 3 and never answers /health 200; kill -9 of decode mid-transfer leaves prefill
healthy with its pool back to baseline; kill -9 of prefill fails in-flight requests within the transfer
timeout and decode re-pairs when prefill returns; a room whose other half never comes errors within the
transfer timeout on both sides.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest

from specctl.engine.checkpoint import write_random_model
from specctl.engine.config import EngineConfig
from specctl.engine.engine import Engine
from specctl.engine.sampling_params import SamplingParams
from specctl.orchestrate.ports import free_port, free_ports
from specctl.schemas.role_config import RoleConfig

pytestmark = pytest.mark.slow

PROMPTS = ["def fib(n):\n    if n < 2:", "import os\nimport sys\n\n", "class Tree:\n    def __init__(self, left):",
           "for i in range(10):\n", "with open(path) as f:\n", "try:\n    x = 1\nexcept"]
MAX_TOKENS = 10
CORRUPT_MARK = "#corrupt-this-payload"
START_TIMEOUT = 120.0
OFFLINE = {"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
ADAPTIVE = ("{algorithm: draft, draft: %s, num_steps: 3, adaptive: {strategy: ema, warmup_batches: 2, "
            "update_interval: 2, buckets: {1: {candidate_steps: [1, 3]}, 4: {candidate_steps: [0, 1, 3]}}}}")


def http(method: str, url: str, body: Any = None, timeout: float = 60.0) -> tuple[int | None, Any]:
    data = json.dumps(body).encode() if body is not None else None
    req = urllib.request.Request(url, data=data, method=method, headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            raw = r.read()
            return r.status, json.loads(raw) if raw.strip() else {}
    except urllib.error.HTTPError as exc:
        raw = exc.read() or b"{}"
        try:
            return exc.code, json.loads(raw)
        except ValueError:
            return exc.code, {"error": {"message": raw.decode(errors="replace")}}
    except (urllib.error.URLError, OSError):
        return None, {}


def wait_for(pred: Any, timeout: float, what: str, poll: float = 0.1, *, show: Sequence[Proc] = ()) -> Any:
    """Poll `pred` until it is truthy; on timeout fail naming `what`, with the exit status and log tail of
    each process in `show` (a CI failure then says why a server never came up)."""
    deadline = time.monotonic() + timeout
    while True:
        value = pred()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}" + "".join(p.tail() for p in show))
        time.sleep(poll)


def deployment_yaml(path: Path, *, target: Path, draft: Path | None, ports: dict[str, Any], timeout_s: float,
                    secret_env: str | None = None) -> Path:
    spec = ADAPTIVE % draft if draft is not None else "{algorithm: none}"
    pre = ports["prefill"] if isinstance(ports["prefill"], list) else [(ports["prefill"], ports["bootstrap"])]
    dec = ports["decode"] if isinstance(ports["decode"], list) else [ports["decode"]]
    pre_yaml = "\n".join(f"    - {{host: 127.0.0.1, port: {p}, bootstrap_port: {b}}}" for p, b in pre)
    dec_yaml = "\n".join(f"    - {{host: 127.0.0.1, port: {p}}}" for p in dec)
    secret = f", secret_env: {secret_env}" if secret_env else ""
    path.write_text(f"""version: 1
name: {path.stem}
model: {{target: {target}, dtype: float32, device: cpu}}
speculative: {spec}
cache: {{page_size: 4, max_tokens: 2048}}
serve: {{max_batch_size: 8}}
transfer: {{backend: zmq, timeout_s: {timeout_s}{secret}}}
roles:
  prefill:
{pre_yaml}
  decode:
{dec_yaml}
  router: {{host: 127.0.0.1, port: {ports['router']}}}
""")
    return path


class Proc:
    """One `specctl serve --role R` process with its own log."""

    def __init__(self, role: str, config: Path, log: Path, *, sets: tuple[str, ...] = (),
                 env: dict[str, str] | None = None, instance: int = 0, fault_plan: Path | None = None) -> None:
        cmd = [sys.executable, "-m", "specctl.cli", "serve", "--role", role, "-c", str(config),
               "--instance", str(instance)]
        if fault_plan is not None:
            cmd += ["--fault-plan", str(fault_plan)]
        for s in sets:
            cmd += ["--set", s]
        self.log = log
        self.out = open(log, "wb")  # noqa: SIM115 - closed in stop()
        self.p = subprocess.Popen(cmd, stdout=self.out, stderr=subprocess.STDOUT,
                                  env={**os.environ, **OFFLINE, "SPECCTL_LOG_LEVEL": "INFO", **(env or {})})

    def kill9(self) -> None:
        self.p.send_signal(signal.SIGKILL)
        self.p.wait(10)

    def stop(self) -> None:
        if self.p.poll() is None:
            self.p.terminate()
            try:
                self.p.wait(15)
            except subprocess.TimeoutExpired:
                self.p.kill()
                self.p.wait(5)
        self.out.close()

    def text(self) -> str:
        return self.log.read_text(errors="replace")

    def tail(self, chars: int = 3000) -> str:
        return f"\n--- {self.log.name} (exit status {self.p.poll()}) ---\n{self.text()[-chars:]}"


def healthy(url: str) -> bool:
    return http("GET", url + "/health", timeout=2)[0] == 200


def router_ready(url: str) -> bool:
    return http("GET", url + "/readiness", timeout=2)[0] == 200


@pytest.fixture(scope="module")
def models(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("pd")
    target = write_random_model(root / "target", sliding_window=6)  # mamba, swa, full, swa
    draft = write_random_model(root / "draft", layer_kinds=("full",), seed=1)
    return {"target": target, "draft": draft, "root": root}


@pytest.fixture(scope="module")
def offline(models: dict[str, Path]) -> dict[str, list[int]]:
    role = {"model": {"target": str(models["target"]), "dtype": "float32", "device": "cpu"},
            "cache": {"page_size": 4, "max_tokens": 2048}, "serve": {"max_batch_size": 8}}
    engine = Engine(EngineConfig.from_role(RoleConfig.from_json(role)))
    prompts = [*PROMPTS, CORRUPT_MARK + " x = 1"]
    results = engine.generate(prompts, SamplingParams(max_tokens=MAX_TOKENS, temperature=0.0, ignore_eos=True))
    return {p: r.token_ids for p, r in zip(prompts, results, strict=True)}


_SERVED: dict[str, str] = {}


def served_model(url: str) -> str:
    """The model id a server (or the router, from its workers) lists: unknown names are a 404."""
    if url not in _SERVED:
        code, body = http("GET", url + "/v1/models", timeout=30)
        assert code == 200, body
        _SERVED[url] = body["data"][0]["id"]
    return _SERVED[url]


def complete(url: str, prompt: str, **kw: Any) -> tuple[int | None, Any]:
    body = {"model": served_model(url), "prompt": prompt, "max_tokens": MAX_TOKENS, "temperature": 0,
            "ignore_eos": True, "return_token_ids": True, **kw}
    return http("POST", url + "/v1/completions", body, timeout=90)


def concurrent(url: str, prompts: list[str]) -> dict[str, tuple[int | None, Any]]:
    out: dict[str, tuple[int | None, Any]] = {}
    threads = [threading.Thread(target=lambda p=p: out.__setitem__(p, complete(url, p))) for p in prompts]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    return out


def info(url: str) -> dict[str, Any]:
    code, body = http("GET", url + "/server_info", timeout=10)
    assert code == 200, body
    return dict(body)


# ------------------------------------------------------------------------ specctl up: 2 prefill + 2 decode, adaptive


@pytest.fixture(scope="module")
def spec_topology(models: dict[str, Path]) -> Iterator[dict[str, Any]]:
    p = free_ports(7)
    ports: dict[str, Any] = {"prefill": [(p[0], p[1]), (p[2], p[3])], "decode": [p[4], p[5]], "router": p[6]}
    cfg = deployment_yaml(models["root"] / "spec-pd.yaml", target=models["target"], draft=models["draft"],
                          ports=ports, timeout_s=20)
    out_path, err = models["root"] / "up.out", models["root"] / "up.err"
    out = open(out_path, "wb")  # noqa: SIM115
    with open(err, "wb") as errf:
        up = subprocess.Popen([sys.executable, "-m", "specctl.cli", "up", "-c", str(cfg), "--format", "json",
                               "--log-dir", str(models["root"] / "spec-logs")], stdout=out, stderr=errf,
                              env={**os.environ, **OFFLINE})
        try:
            ready = wait_for(lambda: out_path.read_text().strip() or up.poll() is not None,
                             START_TIMEOUT, "specctl up to report ready", poll=0.25)
            assert up.poll() is None, err.read_text()
            body = json.loads(str(ready).splitlines()[0]) if isinstance(ready, str) else None
            assert body and body["ok"] and body["url"] == f"http://127.0.0.1:{ports['router']}"
            assert [p["role"] for p in body["processes"]] == ["prefill", "prefill.1", "decode", "decode.1", "router"]
            yield {"url": body["url"], "ports": ports, "up": up, "err": err,
                   "prefill": [f"http://127.0.0.1:{p}" for p, _ in ports["prefill"]],
                   "decode": [f"http://127.0.0.1:{p}" for p in ports["decode"]]}
            # One process dies: `specctl up` names it, stops the others (the router too) and exits 3.
            os.kill(int(info(f"http://127.0.0.1:{ports['decode'][1]}")["pid"]), signal.SIGKILL)
            assert up.wait(60) == 3
            text = err.read_text()
            assert "decode.1 (pid" in text and "exited with code -9" in text, text
        finally:
            if up.poll() is None:
                up.send_signal(signal.SIGTERM)
                up.wait(40)
            out.close()
    for url in [f"http://127.0.0.1:{ports['router']}", *(f"http://127.0.0.1:{p}" for p, _ in ports["prefill"])]:
        assert http("GET", url + "/health", timeout=2)[0] is None


def test_disaggregated_adaptive_speculation_matches_colocated_over_two_pairs(
    spec_topology: dict[str, Any], offline: dict[str, list[int]]
) -> None:
    results = concurrent(spec_topology["url"], PROMPTS)
    for prompt in PROMPTS:
        code, body = results[prompt]
        assert code == 200, body
        assert body["choices"][0]["token_ids"] == offline[prompt], prompt
        usage = body["usage"]
        assert usage["completion_tokens"] == MAX_TOKENS
        # decode really speculated: verify steps recorded, fewer than tokens (the first came from prefill)
        assert 1 <= usage["spec_verify_steps"] <= MAX_TOKENS - 1
        assert len(usage["accept_lengths"]) == usage["spec_verify_steps"]
        assert body["timings"]["transfer_s"] >= 0 and body["timings"]["prefill_s"] > 0
    # The router balanced over both instances of each role; every decode paired with every prefill.
    prefills = [info(u) for u in spec_topology["prefill"]]
    decodes = [info(u) for u in spec_topology["decode"]]
    assert all(p["timing"]["completed"] >= 1 for p in prefills), [p["timing"] for p in prefills]
    assert sum(p["timing"]["completed"] for p in prefills) >= len(PROMPTS)
    assert all(d["timing"]["imported"] >= 1 for d in decodes)
    assert all(p["bootstrap"]["sessions"] == 2 for p in prefills)
    for d in decodes:
        assert len(d["pairing"]) == 2 and all(link["ready"] for link in d["pairing"])
        assert d["fingerprints"]["registration"] == prefills[0]["fingerprints"]["registration"]
        # SGLang's /server_info keys, with the measured acceptance
        assert d["disaggregation_mode"] == "decode" and d["speculative_algorithm"] == "DRAFT"
        assert d["internal_states"][0]["avg_spec_accept_length"] >= 1.0
        assert "registration" not in d  # the fingerprint only: nothing to impersonate a peer with
    assert all(p["pool"]["free_pages"] == p["pool"]["total_pages"] for p in prefills)
    # Each role counts what it does itself (docs/metrics.md): prefill the bytes it sent, decode its verifies.
    for url, line_start, label in ((spec_topology["prefill"][0], "specctl_transfer_bytes_total{", 'direction="sent"'),
                                   (spec_topology["decode"][0], "specctl_spec_verify_steps_total", "")):
        with urllib.request.urlopen(url + "/metrics", timeout=10) as r:
            metrics = r.read().decode()
        rows = [x for x in metrics.splitlines() if x.startswith(line_start) and label in x]
        assert len(rows) == 1 and float(rows[0].split()[-1]) > 0, (url, rows)


def test_openai_client_streams_and_non_streams_through_the_router(
    spec_topology: dict[str, Any], offline: dict[str, list[int]]
) -> None:
    import openai

    client = openai.OpenAI(base_url=spec_topology["url"] + "/v1", api_key="none", timeout=60, max_retries=0)
    prompt = PROMPTS[0]
    model = client.models.list().data[0].id
    res = client.completions.create(model=model, prompt=prompt, max_tokens=MAX_TOKENS, temperature=0,
                                    extra_body={"ignore_eos": True})
    expected = bytes(t for t in offline[prompt] if t < 256).decode("utf-8", errors="replace")
    assert res.choices[0].text == expected
    assert res.usage is not None and res.usage.completion_tokens == MAX_TOKENS
    stream = client.completions.create(model=model, prompt=prompt, max_tokens=MAX_TOKENS, temperature=0,
                                       stream=True, extra_body={"ignore_eos": True})
    assert "".join(c.choices[0].text for c in stream if c.choices) == expected
    chat = client.chat.completions.create(model=model, messages=[{"role": "user", "content": "hi"}], max_tokens=4,
                                          temperature=0, stream=True, extra_body={"ignore_eos": True})
    assert len([c for c in chat if c.choices and c.choices[0].delta.content]) >= 1


def test_native_generate_through_the_router_reports_accept_length(
    spec_topology: dict[str, Any], offline: dict[str, list[int]]
) -> None:
    prompt = PROMPTS[1]
    code, body = http("POST", spec_topology["url"] + "/generate", {
        "text": prompt, "sampling_params": {"max_new_tokens": MAX_TOKENS, "temperature": 0, "ignore_eos": True}})
    assert code == 200, body
    assert body["output_ids"] == offline[prompt]
    meta = body["meta_info"]
    assert meta["completion_tokens"] == MAX_TOKENS and meta["finish_reason"] == {"type": "length"}
    # SGLang's accept length: completion tokens per verify, the prefill's first token included
    assert meta["spec_verify_ct"] >= 1 and 1.0 <= meta["spec_accept_length"] <= 4.0 + 1 / meta["spec_verify_ct"]


# ------------------------------------------------------------------------------------------ plain decode + faults


@pytest.fixture(scope="module")
def plain(models: dict[str, Path]) -> Iterator[dict[str, Any]]:
    ports = dict(zip(("prefill", "decode", "router", "bootstrap"), free_ports(4), strict=True))
    cfg = deployment_yaml(models["root"] / "plain-pd.yaml", target=models["target"], draft=None, ports=ports,
                          timeout_s=4)
    logs = models["root"] / "plain-logs"
    logs.mkdir()
    # Prefill holds each payload 1.5 s before sending it, so the fault tests can kill a peer while a
    # transfer is in flight (a test-only FaultPlan file, read once at start: engine/serve/faults.py).
    hold = models["root"] / "plain-faults.json"
    hold.write_text(json.dumps({"prefill_hold_s": 1.5, "prefill_corrupt_marker": CORRUPT_MARK}))
    t: dict[str, Any] = {"cfg": cfg, "ports": ports, "logs": logs, "hold": hold,
                         "url": {r: f"http://127.0.0.1:{ports[r]}" for r in ("prefill", "decode", "router")}}
    t["prefill"] = Proc("prefill", cfg, logs / "prefill.log", fault_plan=hold)
    t["decode"] = Proc("decode", cfg, logs / "decode.log")
    try:
        wait_for(lambda: healthy(t["url"]["prefill"]) and healthy(t["url"]["decode"]), START_TIMEOUT,
                 "plain prefill and decode ready", show=(t["prefill"], t["decode"]))
        t["router"] = Proc("router", cfg, logs / "router.log")
        wait_for(lambda: router_ready(t["url"]["router"]), START_TIMEOUT, "smg ready")
        yield t
    finally:
        for role in ("router", "decode", "prefill"):
            if role in t and t[role].p.poll() is None:
                t[role].p.terminate()
        for role in ("router", "decode", "prefill"):
            if role in t:
                t[role].stop()


def test_disaggregated_plain_decode_matches_colocated(plain: dict[str, Any], offline: dict[str, list[int]]) -> None:
    results = concurrent(plain["url"]["router"], PROMPTS[:3])
    for prompt in PROMPTS[:3]:
        code, body = results[prompt]
        assert code == 200, body
        assert body["choices"][0]["token_ids"] == offline[prompt], prompt
        assert body["usage"]["spec_verify_steps"] == 0


def test_sglangs_default_model_name_is_served_through_the_router(plain: dict[str, Any],
                                                                 offline: dict[str, list[int]]) -> None:
    code, body = complete(plain["url"]["router"], PROMPTS[0], model="default")  # what SGLang's clients send
    assert code == 200, body
    assert body["choices"][0]["token_ids"] == offline[PROMPTS[0]]


def test_sglang_router_stays_selectable_and_serves_the_same_tokens(plain: dict[str, Any],
                                                                   offline: dict[str, list[int]]) -> None:
    port, metrics = free_ports(2)
    sets = ("roles.router.kind=sglang-router", f"roles.router.port={port}", f"roles.router.metrics_port={metrics}")
    router = Proc("router", plain["cfg"], plain["logs"] / "sglang-router.log", sets=sets)
    url = f"http://127.0.0.1:{port}"
    try:
        wait_for(lambda: router_ready(url), START_TIMEOUT, "sglang-router ready", show=(router,))
        for model in (served_model(plain["url"]["decode"]), "default"):
            code, body = complete(url, PROMPTS[1], model=model)
            assert code == 200, (model, body)
            assert body["choices"][0]["token_ids"] == offline[PROMPTS[1]]
    finally:
        router.stop()
    assert "sglang_router" in router.text() or "sglang-router" in router.text()
    assert "no client timeouts" in router.text()  # serve --role router says what this router leaves open


def test_direct_requests_to_prefill_or_decode_are_refused_with_a_reason(plain: dict[str, Any]) -> None:
    for role in ("prefill", "decode"):
        code, body = complete(plain["url"][role], PROMPTS[0])
        assert code == 400 and body["error"]["param"] == "bootstrap_room", body
        assert "sglang-router" in body["error"]["message"]


def test_a_payload_that_breaks_the_registration_fails_only_that_request(
    plain: dict[str, Any], offline: dict[str, list[int]]
) -> None:
    # Prefill sends this one request's components in reverse order (test-only fault): decode checks every
    # payload against the registration and fails it naming the room and the field; the requests beside it
    # are served exactly, and prefill's pages come back.
    bad = CORRUPT_MARK + " x = 1"
    results = concurrent(plain["url"]["router"], [PROMPTS[0], bad, PROMPTS[1]])
    code, body = results[bad]
    assert code is not None and code >= 500, body
    message = json.dumps(body)
    assert "room-" in message and "components" in message and "order" in message, message
    for prompt in (PROMPTS[0], PROMPTS[1]):
        code, body = results[prompt]
        assert code == 200 and body["choices"][0]["token_ids"] == offline[prompt], body
    wait_for(lambda: info(plain["url"]["prefill"])["in_flight"] == 0, 30, "prefill to drop the rejected room")
    pool = info(plain["url"]["prefill"])["pool"]
    assert pool["free_pages"] == pool["total_pages"]
    assert healthy(plain["url"]["decode"]) and router_ready(plain["url"]["router"])


def test_a_room_whose_other_half_never_comes_errors_within_the_timeout(plain: dict[str, Any]) -> None:
    # What the router sends, but only to one side: each half fails within transfer.timeout_s (4 s), clearly,
    # and leaves nothing behind. A direct client can do this, so it is the client's error (408), not a 5xx.
    bport = plain["ports"]["bootstrap"]
    for role, room in (("decode", 111), ("prefill", 222)):
        t0 = time.monotonic()
        code, body = complete(plain["url"][role], PROMPTS[0], bootstrap_host="127.0.0.1", bootstrap_port=bport,
                              bootstrap_room=room)
        elapsed = time.monotonic() - t0
        assert code == 408 and body["error"]["code"] == "request_timeout", body
        assert f"room-{room}" in body["error"]["message"] and "4s" in body["error"]["message"], body
        assert "a prefill and a decode both" in body["error"]["message"], body
        assert elapsed < 4 + 3, f"{role}'s half-room took {elapsed:.1f}s to fail"
    assert info(plain["url"]["prefill"])["in_flight"] == 0
    d = info(plain["url"]["decode"])
    assert d["engine"]["free_pages"] == d["engine"]["total_pages"]


@pytest.mark.parametrize(("role", "room"), [("decode", 333), ("prefill", 334)])
def test_a_second_request_for_a_room_being_served_is_a_409(plain: dict[str, Any], role: str, room: int) -> None:
    # A room is one request's: sglang-router draws a fresh one each time, so a repeat is the client's to fix.
    url = plain["url"][role]
    fields = {"bootstrap_host": "127.0.0.1", "bootstrap_port": plain["ports"]["bootstrap"], "bootstrap_room": room}
    first: dict[str, Any] = {}
    t = threading.Thread(target=lambda: first.update(r=complete(url, PROMPTS[0], **fields)))
    t.start()
    try:
        wait_for(lambda: info(url)["in_flight"] == 1, 3, f"{role} to hold room {room}")
        code, body = complete(url, PROMPTS[1], **fields)
        assert code == 409 and body["error"]["param"] == "bootstrap_room", body
        assert body["error"]["code"] == "room_in_use" and str(room) in body["error"]["message"], body
    finally:
        t.join(15)
    code, body = first["r"]  # its other half never comes: it fails as before, within the transfer timeout
    assert code == 408 and f"room-{room}" in body["error"]["message"], body


def test_mismatched_decode_is_refused_with_the_diff_and_never_healthy(plain: dict[str, Any], models: dict) -> None:
    # The decode's own file drifted from prefill's (a different page size, and it speculates with a draft
    # whose KV this prefill does not produce). Each file is symmetric on its own, so `validate` passes both:
    # only the live handshake can catch it.
    port = free_port()
    ports = {**plain["ports"], "decode": port}
    drifted = deployment_yaml(models["root"] / "drifted-pd.yaml", target=models["target"], draft=models["draft"],
                              ports=ports, timeout_s=6)
    drifted.write_text(drifted.read_text().replace("page_size: 4", "page_size: 8"))
    bad = Proc("decode", drifted, plain["logs"] / "bad-decode.log")
    seen_200 = False
    try:
        deadline = time.monotonic() + START_TIMEOUT
        while bad.p.poll() is None and time.monotonic() < deadline:
            seen_200 |= healthy(f"http://127.0.0.1:{port}")
            time.sleep(0.1)
        assert bad.p.poll() == 3, bad.text()
    finally:
        bad.stop()
    assert not seen_200
    text = bad.text()
    assert "handshake refused" in text
    table = text[text.index("field"):]
    for field in ("page_size", "draft", "speculative_algorithm", "max_draft_tokens"):
        assert field in table, field
    logged = [line for line in text.splitlines() if '"event": "handshake_refused"' in line]
    assert logged, "the diff is logged as JSON"
    diff = json.loads(logged[0][logged[0].index("{"):])
    assert {"page_size", "draft"} <= {m["field"] for m in diff["mismatches"]}
    # The good pair is undisturbed.
    assert healthy(plain["url"]["decode"]) and router_ready(plain["url"]["router"])


def test_kill_decode_mid_transfer_frees_prefill_pages(plain: dict[str, Any], offline: dict[str, list[int]]) -> None:
    result: dict[str, Any] = {}
    sender = threading.Thread(target=lambda: result.update(r=complete(plain["url"]["router"], PROMPTS[1])))
    sender.start()
    # Prefill holds the room (prefilled, exported, held before the send): now kill decode.
    wait_for(lambda: info(plain["url"]["prefill"])["in_flight"] >= 1, 30, "prefill to hold the room")
    plain["decode"].kill9()
    sender.join(60)
    code, body = result["r"]
    assert code is not None and code >= 500, body
    wait_for(lambda: info(plain["url"]["prefill"])["in_flight"] == 0, 30, "prefill to drop the room")
    pool = info(plain["url"]["prefill"])["pool"]
    assert pool["free_pages"] == pool["total_pages"]
    assert healthy(plain["url"]["prefill"])
    # A new decode pairs again and the router serves through it.
    plain["decode"].stop()
    plain["decode"] = Proc("decode", plain["cfg"], plain["logs"] / "decode2.log")
    wait_for(lambda: healthy(plain["url"]["decode"]), START_TIMEOUT, "restarted decode to pair",
             show=(plain["prefill"], plain["decode"]))
    wait_for(lambda: complete(plain["url"]["router"], PROMPTS[0])[0] == 200, 30, "the router to route again",
             poll=0.5, show=(plain["router"], plain["prefill"], plain["decode"]))
    code, body = complete(plain["url"]["router"], PROMPTS[0])
    assert code == 200 and body["choices"][0]["token_ids"] == offline[PROMPTS[0]]


def test_kill_prefill_fails_in_flight_requests_and_decode_repairs(
    plain: dict[str, Any], offline: dict[str, list[int]]
) -> None:
    result: dict[str, Any] = {}
    t0 = time.monotonic()
    sender = threading.Thread(target=lambda: result.update(r=complete(plain["url"]["router"], PROMPTS[2])))
    sender.start()
    wait_for(lambda: info(plain["url"]["prefill"]).get("in_flight", 0) >= 1, 30, "the request to reach prefill")
    plain["prefill"].kill9()
    sender.join(60)
    elapsed = time.monotonic() - t0
    code, body = result["r"]
    assert code is not None and code >= 500, body
    assert elapsed < 4 + 10, f"in-flight request took {elapsed:.1f}s to fail"  # transfer.timeout_s + slack
    wait_for(lambda: http("GET", plain["url"]["decode"] + "/health", timeout=2)[0] == 503, 15,
             "decode to notice prefill is gone")
    plain["prefill"].stop()
    plain["prefill"] = Proc("prefill", plain["cfg"], plain["logs"] / "prefill2.log", fault_plan=plain["hold"])
    wait_for(lambda: healthy(plain["url"]["prefill"]) and healthy(plain["url"]["decode"]), START_TIMEOUT,
             "decode to re-pair", show=(plain["prefill"], plain["decode"]))
    wait_for(lambda: complete(plain["url"]["router"], PROMPTS[2])[0] == 200, 30, "the router to route again",
             poll=0.5, show=(plain["router"], plain["prefill"], plain["decode"]))
    code, body = complete(plain["url"]["router"], PROMPTS[2])
    assert code == 200 and body["choices"][0]["token_ids"] == offline[PROMPTS[2]]


def test_the_router_role_stops_cleanly_with_its_router(plain: dict[str, Any]) -> None:
    router = plain["router"]
    t0 = time.monotonic()
    router.p.terminate()
    assert router.p.wait(20) == 0, router.text()[-2000:]
    assert time.monotonic() - t0 < 10  # a short shutdown grace, not the router's default 180 s
    assert http("GET", plain["url"]["router"] + "/readiness", timeout=2)[0] is None  # its child is gone too


# ------------------------------------------------------------------------------------------ burst vs. timeout


def test_a_burst_is_prefilled_in_batches_within_a_short_transfer_timeout(
    models: dict[str, Path], offline: dict[str, list[int]]
) -> None:
    # 16 requests at once on a prefill that batches 4 at a time: the last ones queue on prefill for longer
    # than the 1.5 s transfer timeout would allow one at a time... the timeout measures liveness, not
    # queueing, so every request completes, exactly; and prefill ran them in batches (fewer engine steps
    # than requests).
    ports = dict(zip(("prefill", "decode", "router", "bootstrap"), free_ports(4), strict=True))
    cfg = deployment_yaml(models["root"] / "burst-pd.yaml", target=models["target"], draft=None, ports=ports,
                          timeout_s=30)
    logs = models["root"] / "burst-logs"
    logs.mkdir()
    sets = ("transfer.timeout_s=1.5", "serve.max_batch_size=4")
    procs = [Proc("prefill", cfg, logs / "prefill.log", sets=sets), Proc("decode", cfg, logs / "decode.log", sets=sets)]
    urls = [f"http://127.0.0.1:{ports[r]}" for r in ("prefill", "decode", "router")]
    try:
        wait_for(lambda: all(healthy(u) for u in urls[:2]), START_TIMEOUT, "burst engines ready")
        procs.append(Proc("router", cfg, logs / "router.log", sets=sets))
        wait_for(lambda: router_ready(urls[2]), START_TIMEOUT, "burst router ready")
        burst = [PROMPTS[i % len(PROMPTS)] for i in range(16)]
        out: list[Any] = [None] * len(burst)

        def one(i: int) -> None:
            out[i] = complete(urls[2], burst[i])

        threads = [threading.Thread(target=one, args=(i,)) for i in range(len(burst))]
        for t in threads:
            t.start()
        for t in threads:
            t.join(120)
        for prompt, (code, body) in zip(burst, out, strict=True):
            assert code == 200, body
            assert body["choices"][0]["token_ids"] == offline[prompt]
        engine = info(urls[0])["engine"]
        assert engine["finished"] == len(burst) and engine["steps"] < len(burst), engine
    finally:
        for p in procs:
            p.stop()


def test_a_request_aborted_mid_prefill_leaves_nothing_pending_on_prefill(models: dict[str, Path]) -> None:
    """A prefill backend in this process (its real engine thread and ZMQ sockets on loopback): a request admitted
    and then aborted before its first token was sampled (the client went away) leaves nothing in the engine (no
    request, every page free), and the next request is prefilled and exported as usual. The engine thread is
    held by two gates so the order is fixed: admission, then the client's cancel, then the abort."""
    import asyncio
    import contextlib

    from specctl.engine.serve.backend import RoleContext
    from specctl.engine.serve.prefill import PrefillBackend
    from specctl.schemas.validator import load_deployment

    ports = dict(zip(("prefill", "decode", "router", "bootstrap"), free_ports(4), strict=True))
    dep = load_deployment(deployment_yaml(models["root"] / "pending-pd.yaml", target=models["target"], draft=None,
                                          ports=ports, timeout_s=6))
    backend = PrefillBackend(RoleContext(deployment=dep, role_name="prefill", role=dep.instances("prefill")[0]))

    async def scenario() -> tuple[bool, tuple[bool, bool]]:
        await backend.load()
        aengine = backend.aengine
        assert aengine is not None
        try:
            # The engine thread takes its inbox in order: gate 1, the request's admission, gate 2.
            first, second, in_second = threading.Event(), threading.Event(), threading.Event()
            held = asyncio.ensure_future(aengine.call(lambda eng: first.wait(10)))
            task = asyncio.ensure_future(backend._prefill(list(range(3, 40)), SamplingParams(max_tokens=4)))
            await asyncio.sleep(0.1)  # the task ran up to queueing its admission (event-loop work only)
            held_again = asyncio.ensure_future(aengine.call(lambda eng: (in_second.set(), second.wait(10))))
            await asyncio.sleep(0.1)  # that call is queued too (its task's first step: event-loop work only)
            first.set()  # the engine admits the request, then waits in the second gate before any step
            await held
            assert await asyncio.to_thread(in_second.wait, 10)
            assert backend.engine is not None
            admitted = backend.engine.has_unfinished()  # the engine thread is parked in the gate: a safe read
            task.cancel()  # the client goes away: its abort is queued behind the second gate
            with contextlib.suppress(asyncio.CancelledError):
                await task
            second.set()
            await held_again
            out = await backend._prefill(list(range(5, 20)), SamplingParams(max_tokens=4))  # later ones step on
            assert out.finish_reason == "prefilled" and out.prefilled is not None, out
            assert out.prefilled.length == 15 and out.prefilled.tensors
            return admitted, await aengine.call(lambda eng: (
                eng.has_unfinished(), eng.runner.num_free_pages == eng.runner.num_total_pages))
        finally:
            await backend.close()

    admitted, (unfinished, all_free) = asyncio.run(scenario())
    assert admitted  # the aborted request had been admitted and was waiting for its first token
    assert not unfinished and all_free


def test_a_decode_whose_background_link_fails_exits_3_naming_it(models: dict[str, Path], tmp_path: Path) -> None:
    """A failure the links do not expect (a bug; here the test-only `decode_link_error` fault) ends the decode
    role with exit 3 and the reason on its output, where the task used to die unseen and /health said
    "pairing" for ever. No prefill runs: the fault fires before registering."""
    ports = dict(zip(("prefill", "decode", "router", "bootstrap"), free_ports(4), strict=True))
    cfg = deployment_yaml(tmp_path / "linkfail-pd.yaml", target=models["target"], draft=None, ports=ports,
                          timeout_s=6)
    plan = tmp_path / "linkfail.json"
    plan.write_text(json.dumps({"decode_link_error": "planted link failure"}))
    dec = Proc("decode", cfg, tmp_path / "decode.log", fault_plan=plan)
    try:
        dec.p.wait(START_TIMEOUT)
    finally:
        dec.stop()
    text = dec.text()
    assert dec.p.returncode == 3, text
    assert f"the link to prefill tcp://127.0.0.1:{ports['bootstrap']} failed: RuntimeError: planted link failure" \
        in text, text
