"""Per-role /metrics after real traffic through a real disaggregated topology (`specctl up`: prefill, decode
with draft speculation, router; loopback HTTP and ZMQ), parsed with Prometheus' own parser.

Oracles: each role counts what it did (prefill: prompts, prefill time, bytes and time sent; decode:
generated tokens, ITL, speculative verify steps, bytes and time received, and, as the front that answers
the client behind the router (smg), requests and TTFT; the router's own exporter is not read); the counts
match the traffic sent; every series carries `model_name`; no gauge is named like a counter.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families

from specctl.engine.checkpoint import write_random_model
from specctl.orchestrate.ports import free_ports
from specctl.schemas.role_config import RoleConfig

pytestmark = pytest.mark.slow

MAX_TOKENS = 8
PROMPTS = ["def fib(n):", "import os\n", "class Tree:"]
ENV = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}


def post(url: str, body: dict[str, Any]) -> str:
    if "model" not in body:  # the router requires it (422 without); servers 404 an unknown name
        with urllib.request.urlopen(url.rsplit("/v1/", 1)[0] + "/v1/models", timeout=30) as r:
            body = {**body, "model": json.loads(r.read())["data"][0]["id"]}
    req = urllib.request.Request(url, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=90) as r:
        assert r.status == 200
        return r.read().decode()


def scrape(url: str) -> tuple[dict[tuple[str, tuple[tuple[str, str], ...]], float], dict[str, str], set[str]]:
    """(value by (sample name, labels without model_name), type by family, model names seen)."""
    with urllib.request.urlopen(url + "/metrics", timeout=30) as r:
        text = r.read().decode()
    values: dict[tuple[str, tuple[tuple[str, str], ...]], float] = {}
    types: dict[str, str] = {}
    models: set[str] = set()
    for family in text_string_to_metric_families(text):
        types[family.name] = family.type
        for s in family.samples:
            labels = dict(s.labels)
            models.add(labels.pop("model_name", "<missing>"))
            values[(s.name, tuple(sorted(labels.items())))] = s.value
    return values, types, models


def total(values: dict[tuple[str, tuple[tuple[str, str], ...]], float], name: str, **labels: str) -> float:
    want = set(labels.items())
    return sum(v for (n, ls), v in values.items() if n == name and want <= set(ls))


@pytest.fixture(scope="module")
def topology(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    root = tmp_path_factory.mktemp("metrics")
    target = write_random_model(root / "target", sliding_window=6)
    draft = write_random_model(root / "draft", layer_kinds=("full",), seed=1)
    ports = dict(zip(("prefill", "decode", "router", "bootstrap"), free_ports(4), strict=True))
    cfg = root / "pd.yaml"
    cfg.write_text(f"""version: 1
name: metrics-pd
model: {{target: {target}, dtype: float32, device: cpu}}
speculative: {{algorithm: draft, draft: {draft}, num_steps: 3}}
cache: {{page_size: 4, max_tokens: 2048}}
serve: {{max_batch_size: 8}}
transfer: {{backend: zmq, timeout_s: 20}}
roles:
  prefill: {{host: 127.0.0.1, port: {ports['prefill']}, bootstrap_port: {ports['bootstrap']}}}
  decode: {{host: 127.0.0.1, port: {ports['decode']}}}
  router: {{host: 127.0.0.1, port: {ports['router']}}}
""")
    out_path = root / "up.out"
    with open(out_path, "wb") as out, open(root / "up.err", "wb") as err:
        up = subprocess.Popen([sys.executable, "-m", "specctl.cli", "up", "-c", str(cfg), "--format", "json",
                               "--log-dir", str(root / "logs")], stdout=out, stderr=err, env=ENV)
        try:
            deadline = time.monotonic() + 120
            while not out_path.read_text().strip():
                assert up.poll() is None, (root / "up.err").read_text()
                assert time.monotonic() < deadline, "specctl up did not report ready"
                time.sleep(0.25)
            info = json.loads(out_path.read_text().splitlines()[0])
            assert info["ok"], info
            yield {"ports": ports, "model": str(target)}
        finally:
            up.send_signal(signal.SIGTERM)
            up.wait(60)


def test_every_role_counts_what_it_did(topology: dict[str, Any]) -> None:
    ports = topology["ports"]
    router = f"http://127.0.0.1:{ports['router']}"
    for i, prompt in enumerate(PROMPTS):
        post(router + "/v1/completions", {"prompt": prompt, "max_tokens": MAX_TOKENS, "temperature": 0,
                                          "ignore_eos": True, "stream": i % 2 == 1})
    n = len(PROMPTS)
    pre, pre_types, pre_models = scrape(f"http://127.0.0.1:{ports['prefill']}")
    dec, dec_types, dec_models = scrape(f"http://127.0.0.1:{ports['decode']}")
    # The router is smg: its Prometheus exporter is its own (a port of its own, SGLang's names);
    # decode's HTTP front answers the client, so the client-facing counts are decode's.

    # prefill: the prompts it computed, their prefill time, the transfers it sent
    assert total(pre, "specctl_requests_total", status="prefilled") == n
    # counted once, where computed: prefill (each prompt's bytes, plus a BOS where the model has one), never decode
    assert sum(len(p) for p in PROMPTS) <= total(pre, "specctl_prompt_tokens_total") <= sum(len(p) + 1 for p in PROMPTS)
    assert total(dec, "specctl_prompt_tokens_total") == 0
    assert total(pre, "specctl_prefill_seconds_count") == n and total(pre, "specctl_prefill_seconds_sum") > 0
    assert total(pre, "specctl_transfer_bytes_total", direction="sent") > 0
    assert total(pre, "specctl_transfer_seconds_count") == n
    # decode: generation, ITL, acceptance, the transfers it received
    assert total(dec, "specctl_generation_tokens_total") == n * MAX_TOKENS
    assert total(dec, "specctl_inter_token_latency_seconds_count") > 0
    assert total(dec, "specctl_requests_total", status="length") == n
    assert total(dec, "specctl_spec_verify_steps_total") > 0
    assert total(dec, "specctl_spec_accept_length_count") == total(dec, "specctl_spec_verify_steps_total")
    assert total(dec, "specctl_transfer_bytes_total", direction="received") == total(
        pre, "specctl_transfer_bytes_total", direction="sent")
    assert total(dec, "specctl_transfer_seconds_count") == n
    assert total(dec, "specctl_time_to_first_token_seconds_count") == n

    for types, models in ((pre_types, pre_models), (dec_types, dec_models)):
        assert models == {topology["model"]}  # model_name on every series
        for family, kind in types.items():
            if kind == "gauge":
                assert not family.endswith("_total"), family
    for values in (pre, dec):
        assert 0.0 <= total(values, "specctl_kv_cache_usage_ratio") <= 1.0
        assert total(values, "specctl_kv_pages_capacity") > 0
    assert ("specctl_requests_waiting", ()) in dec and ("specctl_requests_running", ()) in dec
    assert any(n == "specctl_adaptive_steps" for n, _ in dec)


def test_logit_bias_and_penalties_through_the_router(topology: dict[str, Any]) -> None:
    """Disaggregated: prefill applies logit_bias to the first token, decode (speculating) to the rest."""
    router = f"http://127.0.0.1:{topology['ports']['router']}"
    body = {"prompt": "def f(x):", "max_tokens": 6, "temperature": 0, "ignore_eos": True}
    forced = json.loads(post(router + "/v1/completions", {**body, "logit_bias": {"65": 100}}))
    assert forced["choices"][0]["text"] == "A" * 6
    # penalties: the same tokens as the offline engine (plain decoding) with the same penalties
    from specctl.engine.config import EngineConfig
    from specctl.engine.engine import Engine
    from specctl.engine.sampling_params import SamplingParams

    role = {"model": {"target": topology["model"], "dtype": "float32", "device": "cpu"},
            "cache": {"page_size": 4, "max_tokens": 2048}, "serve": {"max_batch_size": 8}}
    sp = SamplingParams(max_tokens=6, temperature=0.0, ignore_eos=True, frequency_penalty=2.0, presence_penalty=2.0)
    (want,) = Engine(EngineConfig.from_role(RoleConfig.from_json(role))).generate([body["prompt"]], sp)
    got = json.loads(post(router + "/v1/completions", {**body, "frequency_penalty": 2.0, "presence_penalty": 2.0,
                                                       "return_token_ids": True}))
    assert got["choices"][0]["token_ids"] == want.token_ids
    plain = SamplingParams(max_tokens=6, temperature=0.0, ignore_eos=True)
    (unpenalized,) = Engine(EngineConfig.from_role(RoleConfig.from_json(role))).generate([body["prompt"]], plain)
    assert unpenalized.token_ids != want.token_ids  # the penalties changed something
    # log-probs do not travel prefill -> decode yet: refused by name, not ignored
    with urllib.request.urlopen(router + "/v1/models", timeout=30) as r:
        model = json.loads(r.read())["data"][0]["id"]
    req = urllib.request.Request(router + "/v1/completions",
                                 data=json.dumps({**body, "model": model, "logprobs": 1}).encode(),
                                 headers={"Content-Type": "application/json"})
    try:
        urllib.request.urlopen(req, timeout=30)
        raise AssertionError("logprobs through the router should be refused")
    except urllib.error.HTTPError as exc:
        err = json.loads(exc.read())["error"]
        # the router re-wraps a worker's 4xx as {type, code: "decode_bad_request", message}: the param's
        # name survives in the message only.
        assert exc.code == 400 and "logprobs" in err["message"] and "not supported" in err["message"], err
