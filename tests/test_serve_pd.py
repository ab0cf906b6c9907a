"""Disaggregated serving end to end: real `specctl serve` / `specctl up` processes on loopback, real ZMQ and HTTP.

Oracles: greedy output through router -> decode <- prefill equals the offline Engine's output token for
token (the colocated server equals the offline Engine, tests/test_serve_http.py), with and without
speculation on decode, for concurrent requests on a hybrid model (mamba + swa state crosses the wire);
a mismatched decode is refused with the differing fields, exits 3 and never answers /health 200;
kill -9 of decode mid-transfer leaves prefill healthy with its pool back to baseline; kill -9 of prefill
fails in-flight requests within the transfer timeout and decode re-pairs when prefill returns.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from specctl.engine.checkpoint import write_random_model
from specctl.engine.config import EngineConfig
from specctl.engine.engine import Engine
from specctl.engine.sampling import SamplingParams

pytestmark = pytest.mark.slow

PROMPTS = ["def fib(n):\n    if n < 2:", "import os\nimport sys\n\n", "class Tree:\n    def __init__(self, left):"]
MAX_TOKENS = 10
CORRUPT_MARK = "#corrupt-this-payload"
START_TIMEOUT = 120.0


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def http(method: str, url: str, body: Any = None, timeout: float = 60.0) -> tuple[int | None, Any]:
    data = json.dumps(body).encode() if body is not None else None
    req = urllib.request.Request(url, data=data, method=method, headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read() or b"{}")
    except (urllib.error.URLError, OSError):
        return None, {}


def wait_for(pred: Any, timeout: float, what: str, poll: float = 0.1) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        value = pred()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        time.sleep(poll)


def deployment_yaml(path: Path, *, target: Path, draft: Path | None, ports: dict[str, int], timeout_s: float) -> Path:
    spec = (f"speculative: {{algorithm: draft, draft: {draft}, num_steps: 3}}" if draft is not None
            else "speculative: {algorithm: none}")
    path.write_text(f"""version: 1
name: {path.stem}
model: {{target: {target}, dtype: float32, device: cpu}}
{spec}
cache: {{page_size: 4, max_tokens: 2048}}
serve: {{max_batch_size: 8}}
transfer: {{backend: zmq, timeout_s: {timeout_s}}}
roles:
  prefill: {{host: 127.0.0.1, port: {ports['prefill']}, bootstrap_port: {ports['bootstrap']}}}
  decode: {{host: 127.0.0.1, port: {ports['decode']}}}
  router: {{host: 127.0.0.1, port: {ports['router']}}}
""")
    return path


class Proc:
    """One `specctl serve --role R` process with its own log."""

    def __init__(self, role: str, config: Path, log: Path, *, sets: tuple[str, ...] = (),
                 env: dict[str, str] | None = None) -> None:
        cmd = [sys.executable, "-m", "specctl.cli", "serve", "--role", role, "-c", str(config)]
        for s in sets:
            cmd += ["--set", s]
        self.log = log
        self.out = open(log, "wb")  # noqa: SIM115 - closed in stop()
        self.p = subprocess.Popen(cmd, stdout=self.out, stderr=subprocess.STDOUT,
                                  env={**os.environ, "SPECCTL_LOG_LEVEL": "INFO", **(env or {})})

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


def healthy(url: str) -> bool:
    return http("GET", url + "/health", timeout=2)[0] == 200


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
    engine = Engine(EngineConfig.from_role(role))
    results = engine.generate(PROMPTS, SamplingParams(max_tokens=MAX_TOKENS, temperature=0.0, ignore_eos=True))
    return {p: r.token_ids for p, r in zip(PROMPTS, results, strict=True)}


def complete(url: str, prompt: str, **kw: Any) -> tuple[int | None, Any]:
    body = {"prompt": prompt, "max_tokens": MAX_TOKENS, "temperature": 0, "ignore_eos": True,
            "return_token_ids": True, **kw}
    return http("POST", url + "/v1/completions", body, timeout=90)


def concurrent(url: str, prompts: list[str]) -> dict[str, tuple[int | None, Any]]:
    out: dict[str, tuple[int | None, Any]] = {}
    threads = [threading.Thread(target=lambda p=p: out.__setitem__(p, complete(url, p))) for p in prompts]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    return out


# ------------------------------------------------------------------------------------------ specctl up + draft


@pytest.fixture(scope="module")
def spec_topology(models: dict[str, Path]) -> Iterator[dict[str, Any]]:
    ports = {k: free_port() for k in ("prefill", "decode", "router", "bootstrap")}
    cfg = deployment_yaml(models["root"] / "spec-pd.yaml", target=models["target"], draft=models["draft"],
                          ports=ports, timeout_s=20)
    out = open(models["root"] / "up.out", "wb")  # noqa: SIM115
    err = models["root"] / "up.err"
    with open(err, "wb") as errf:
        up = subprocess.Popen([sys.executable, "-m", "specctl.cli", "up", "-c", str(cfg), "--format", "json",
                               "--log-dir", str(models["root"] / "spec-logs")], stdout=out, stderr=errf)
        try:
            ready = wait_for(lambda: (models["root"] / "up.out").read_text().strip() or up.poll() is not None,
                             START_TIMEOUT, "specctl up to report ready", poll=0.25)
            assert up.poll() is None, err.read_text()
            info = json.loads(str(ready).splitlines()[0]) if isinstance(ready, str) else None
            assert info and info["ok"] and info["url"] == f"http://127.0.0.1:{ports['router']}"
            yield {"url": info["url"], "ports": ports, "up": up, "err": err}
            # One process dies: `specctl up` names it, stops the others and exits 3.
            code, dinfo = http("GET", f"http://127.0.0.1:{ports['decode']}/server_info")
            assert code == 200
            os.kill(int(dinfo["pid"]), signal.SIGKILL)
            assert up.wait(60) == 3
            text = err.read_text()
            assert "decode (pid" in text and "exited with code -9" in text, text
        finally:
            if up.poll() is None:
                up.send_signal(signal.SIGTERM)
                up.wait(40)
            out.close()
    for role in ("prefill", "decode", "router"):
        assert not healthy(f"http://127.0.0.1:{ports[role]}")


def test_up_disaggregated_with_draft_speculation_matches_colocated(
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
    code, info = http("GET", spec_topology["url"] + "/server_info")
    assert code == 200
    assert info["fingerprints"]["prefill"]["registration"] == info["fingerprints"]["decode"]["registration"]
    assert info["roles"]["decode"]["server_info"]["pairing"]["prefill_fingerprint"]
    with urllib.request.urlopen(spec_topology["url"] + "/metrics", timeout=10) as r:
        metrics = r.read().decode()
    sent = [line for line in metrics.splitlines()  # every series also carries model_name (docs/metrics.md)
            if line.startswith("specctl_transfer_bytes_total{") and 'direction="sent"' in line]
    assert len(sent) == 1 and float(sent[0].split()[-1]) > 0  # prefill's transfer metrics, mirrored once
    assert metrics.count("# TYPE specctl_transfer_bytes_total") == 1
    verify = next(x for x in metrics.splitlines() if x.startswith("specctl_spec_verify_steps_total"))
    assert float(verify.split()[-1]) > 0


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


# ------------------------------------------------------------------------------------------ plain decode + faults


@pytest.fixture(scope="module")
def plain(models: dict[str, Path]) -> Iterator[dict[str, Any]]:
    ports = {k: free_port() for k in ("prefill", "decode", "router", "bootstrap")}
    cfg = deployment_yaml(models["root"] / "plain-pd.yaml", target=models["target"], draft=None, ports=ports,
                          timeout_s=6)
    logs = models["root"] / "plain-logs"
    logs.mkdir()
    # Prefill holds each request's pages 1.5 s between export and send, so the fault tests can kill a peer
    # while a transfer is in flight (test-only hook, see pd_prefill.HOLD_ENV).
    hold = {"SPECCTL_TEST_PREFILL_HOLD_S": "1.5", "SPECCTL_TEST_PREFILL_CORRUPT": CORRUPT_MARK}
    t = {"cfg": cfg, "ports": ports, "logs": logs, "hold": hold,
         "url": {r: f"http://127.0.0.1:{ports[r]}" for r in ("prefill", "decode", "router")}}
    t["prefill"] = Proc("prefill", cfg, logs / "prefill.log", env=hold)
    t["decode"] = Proc("decode", cfg, logs / "decode.log")
    t["router"] = Proc("router", cfg, logs / "router.log")
    try:
        wait_for(lambda: all(healthy(u) for u in t["url"].values()), START_TIMEOUT, "plain topology ready")
        yield t
    finally:
        for role in ("router", "decode", "prefill"):
            if t[role].p.poll() is None:
                t[role].p.terminate()
        for role in ("router", "decode", "prefill"):
            t[role].stop()


def test_disaggregated_plain_decode_matches_colocated(plain: dict[str, Any], offline: dict[str, list[int]]) -> None:
    results = concurrent(plain["url"]["router"], PROMPTS)
    for prompt in PROMPTS:
        code, body = results[prompt]
        assert code == 200, body
        assert body["choices"][0]["token_ids"] == offline[prompt], prompt
        assert body["usage"]["spec_verify_steps"] == 0


def test_a_payload_that_breaks_the_registration_fails_only_that_request(
    plain: dict[str, Any], offline: dict[str, list[int]]
) -> None:
    # Prefill sends this one request's components in reverse order (test-only fault, pd_prefill.CORRUPT_ENV):
    # decode checks every payload against the registration and fails it naming the request and the
    # field; the requests beside it are served exactly, and prefill's pages come back.
    bad = CORRUPT_MARK + " x = 1"
    results = concurrent(plain["url"]["router"], [PROMPTS[0], bad, PROMPTS[1]])
    code, body = results[bad]
    assert code is not None and code >= 500, body
    message = body["error"]["message"]
    assert "request " in message and "components" in message and "order" in message, message
    for prompt in (PROMPTS[0], PROMPTS[1]):
        code, body = results[prompt]
        assert code == 200 and body["choices"][0]["token_ids"] == offline[prompt], body
    pool = prefill_pool(plain)["pool"]
    wait_for(lambda: prefill_pool(plain)["pool"]["free_pages"] == pool["baseline_free_pages"], 30,
             "prefill to free the rejected request's pages")
    assert healthy(plain["url"]["decode"]) and healthy(plain["url"]["router"])


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
    assert healthy(plain["url"]["decode"]) and healthy(plain["url"]["router"])


def prefill_pool(plain: dict[str, Any]) -> dict[str, Any]:
    code, info = http("GET", plain["url"]["prefill"] + "/server_info", timeout=5)
    assert code == 200
    return info


def test_kill_decode_mid_transfer_frees_prefill_pages(plain: dict[str, Any], offline: dict[str, list[int]]) -> None:
    base = prefill_pool(plain)["pool"]
    assert base["free_pages"] == base["baseline_free_pages"]
    result: dict[str, Any] = {}
    sender = threading.Thread(target=lambda: result.update(r=complete(plain["url"]["router"], PROMPTS[1])))
    sender.start()
    # The request holds prefill pages (exported, waiting to be sent): now kill decode.
    wait_for(lambda: prefill_pool(plain)["pool"]["free_pages"] < base["baseline_free_pages"], 30,
             "prefill to hold the request's pages")
    plain["decode"].kill9()
    sender.join(60)
    code, body = result["r"]
    assert code == 503 and "decode" in body["error"]["message"], body
    wait_for(lambda: prefill_pool(plain)["pool"]["free_pages"] == base["baseline_free_pages"], 30,
             "prefill to free the request's pages")
    assert healthy(plain["url"]["prefill"])
    assert http("GET", plain["url"]["router"] + "/health")[0] == 503
    # A new decode pairs again and serves.
    plain["decode"].stop()
    plain["decode"] = Proc("decode", plain["cfg"], plain["logs"] / "decode2.log")
    wait_for(lambda: healthy(plain["url"]["decode"]) and healthy(plain["url"]["router"]), START_TIMEOUT,
             "restarted decode to pair")
    code, body = complete(plain["url"]["router"], PROMPTS[0])
    assert code == 200 and body["choices"][0]["token_ids"] == offline[PROMPTS[0]]


def test_kill_prefill_fails_in_flight_requests_and_decode_repairs(
    plain: dict[str, Any], offline: dict[str, list[int]]
) -> None:
    result: dict[str, Any] = {}
    t0 = time.monotonic()
    sender = threading.Thread(target=lambda: result.update(r=complete(plain["url"]["router"], PROMPTS[2])))
    sender.start()
    wait_for(lambda: prefill_pool(plain).get("in_flight", 0) >= 1, 30, "the request to reach prefill")
    plain["prefill"].kill9()
    sender.join(60)
    elapsed = time.monotonic() - t0
    code, body = result["r"]
    assert code == 503, body
    assert "prefill" in body["error"]["message"], body
    assert elapsed < 6 + 10, f"in-flight request took {elapsed:.1f}s to fail"  # transfer.timeout_s + slack
    wait_for(lambda: http("GET", plain["url"]["decode"] + "/health", timeout=2)[0] == 503, 15,
             "decode to notice prefill is gone")
    plain["prefill"].stop()
    plain["prefill"] = Proc("prefill", plain["cfg"], plain["logs"] / "prefill2.log", env=plain["hold"])
    wait_for(lambda: all(healthy(u) for u in plain["url"].values()), START_TIMEOUT, "decode to re-pair")
    code, body = complete(plain["url"]["router"], PROMPTS[2])
    assert code == 200 and body["choices"][0]["token_ids"] == offline[PROMPTS[2]]


# ------------------------------------------------------------------------------------------ burst vs. timeout


def test_a_burst_beyond_one_prefill_batch_completes_within_a_short_transfer_timeout(
    models: dict[str, Path], offline: dict[str, list[int]]
) -> None:
    # 16 requests at once; prefill takes 2 at a time and holds each 0.4 s, so the last ones queue for
    # >= 3 s on prefill: longer than the 2 s transfer timeout. The timeout measures prefill's liveness
    # (from the request's start on prefill), not queueing, so every request completes, exactly.
    ports = {k: free_port() for k in ("prefill", "decode", "router", "bootstrap")}
    cfg = deployment_yaml(models["root"] / "burst-pd.yaml", target=models["target"], draft=None, ports=ports,
                          timeout_s=30)
    logs = models["root"] / "burst-logs"
    logs.mkdir()
    sets = ("transfer.timeout_s=2", "serve.max_batch_size=2")
    procs = [Proc("prefill", cfg, logs / "prefill.log", sets=sets, env={"SPECCTL_TEST_PREFILL_HOLD_S": "0.4"}),
             Proc("decode", cfg, logs / "decode.log", sets=sets), Proc("router", cfg, logs / "router.log", sets=sets)]
    urls = [f"http://127.0.0.1:{ports[r]}" for r in ("prefill", "decode", "router")]
    try:
        wait_for(lambda: all(healthy(u) for u in urls), START_TIMEOUT, "burst topology ready")
        burst = [PROMPTS[i % len(PROMPTS)] for i in range(16)]
        out: list[Any] = [None] * len(burst)

        def one(i: int) -> None:
            out[i] = complete(urls[2], burst[i])

        t0 = time.monotonic()
        threads = [threading.Thread(target=one, args=(i,)) for i in range(len(burst))]
        for t in threads:
            t.start()
        for t in threads:
            t.join(120)
        elapsed = time.monotonic() - t0
        for prompt, (code, body) in zip(burst, out, strict=True):
            assert code == 200, body
            assert body["choices"][0]["token_ids"] == offline[prompt]
        assert elapsed > 2.0, f"the burst took {elapsed:.1f}s: it did not outlast the transfer timeout"
    finally:
        for p in procs:
            p.stop()
