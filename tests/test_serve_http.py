"""The OpenAI-compatible HTTP server over a real Engine (in process, real HTTP on 127.0.0.1, random tiny model).

Oracles: the server's greedy output equals the offline Engine's, token for token; every malformed request
gets a 4xx JSON error and the server keeps serving; a client that disconnects mid-stream gets its pages
freed (pool back to its baseline).
"""

from __future__ import annotations

import asyncio
import json
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch

from specctl.engine.checkpoint import write_random_model
from specctl.engine.config import EngineConfig
from specctl.engine.engine import Engine
from specctl.engine.sampling_params import SamplingParams
from specctl.engine.serve.http import OpenAIServer, chat_prompt, start_http
from specctl.engine.serve.roles import EngineBackend, RoleContext
from specctl.schemas.role_config import RoleConfig

PROMPTS = ["def fib(n):", "import os\nimport sys\n", "class Tree:\n    def __init__(self):"]


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    torch.manual_seed(0)
    return write_random_model(tmp_path_factory.mktemp("serve") / "target")


def role_dict(model_dir: Path) -> dict[str, Any]:
    return {
        "name": "colocated",
        "model": {"target": str(model_dir), "dtype": "float32", "device": "cpu"},
        "speculative": {"algorithm": "none"},
        "cache": {"page_size": 4, "max_tokens": 2048},
        "serve": {"max_batch_size": 8},
        "host": "127.0.0.1",
        "port": 0,
    }


class Server:
    """An OpenAIServer over EngineBackend on a private event loop thread."""

    def __init__(self, model_dir: Path, **limits: Any) -> None:
        """`limits`: start_http's header_timeout_s / max_connections, OpenAIServer's body_timeout_s and
        max_queued_requests."""
        self.ctx = RoleContext(deployment=None, role_name="colocated", role=RoleConfig.from_json(role_dict(model_dir)))
        self.backend = EngineBackend(self.ctx)
        http_limits = {k: limits.pop(k) for k in ("header_timeout_s", "max_connections") if k in limits}
        self.server = OpenAIServer(self.backend, metrics=self.ctx.metrics, max_request_bytes=64 * 1024, **limits)
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()
        self.runner, self.port = self.run(start_http(self.server.app, "127.0.0.1", 0, **http_limits))
        self.url = f"http://127.0.0.1:{self.port}"

    def run(self, coro: Any, timeout: float = 60) -> Any:
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout)

    def load(self) -> None:
        self.run(self.backend.load())
        self.ctx.state.set("ready", ready=True)

    def close(self) -> None:
        self.run(self.backend.close())
        self.run(self.runner.cleanup())
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(5)
        self.loop.close()


def post(url: str, body: Any, *, raw: bytes | None = None, timeout: float = 60) -> tuple[int, Any]:
    data = raw if raw is not None else json.dumps(body).encode()
    req = urllib.request.Request(url, data=data, headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            text = r.read().decode()
            return r.status, text if "text/event-stream" in r.headers.get("Content-Type", "") else json.loads(text)
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read())


def get(url: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(url, timeout=30) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()


def sse_events(text: str) -> list[Any]:
    events = []
    for block in text.split("\n\n"):
        if block.startswith("data: "):
            payload = block[len("data: "):]
            events.append(payload if payload == "[DONE]" else json.loads(payload))
    return events


@pytest.fixture(scope="module")
def server(model_dir: Path) -> Iterator[Server]:
    s = Server(model_dir)
    try:
        # Not ready yet: /health says so, and generation is refused with 503 (not a hang).
        code, body = get(s.url + "/health")
        assert code == 503 and json.loads(body)["status"] == "loading"
        code, err = post(s.url + "/v1/completions", {"prompt": "x", "max_tokens": 2})
        assert code == 503 and err["error"]["code"] == "service_unavailable"
        s.load()
        yield s
    finally:
        s.close()


@pytest.fixture(scope="module")
def offline(model_dir: Path) -> dict[str, list[int]]:
    engine = Engine(EngineConfig.from_role(RoleConfig.from_json(role_dict(model_dir))))
    results = engine.generate(PROMPTS, SamplingParams(max_tokens=12, temperature=0.0, ignore_eos=True))
    return {p: r.token_ids for p, r in zip(PROMPTS, results, strict=True)}


def test_health_models_and_greedy_completion_matches_offline(server: Server, offline: dict[str, list[int]]) -> None:
    assert get(server.url + "/health")[0] == 200
    code, models = get(server.url + "/v1/models")
    assert code == 200 and json.loads(models)["data"][0]["id"] == server.backend.model_name
    for prompt in PROMPTS:
        code, body = post(server.url + "/v1/completions", {"prompt": prompt, "max_tokens": 12, "temperature": 0,
                                                          "ignore_eos": True, "return_token_ids": True})
        assert code == 200, body
        choice = body["choices"][0]
        assert choice["token_ids"] == offline[prompt]
        assert choice["text"] == server.backend.decode(offline[prompt])
        assert choice["finish_reason"] == "length"
        usage = body["usage"]
        assert usage["prompt_tokens"] == len(prompt.encode()) + 1  # BOS, as Engine.encode_prompt
        assert usage["completion_tokens"] == 12 and usage["total_tokens"] == usage["prompt_tokens"] + 12
        assert usage["spec_verify_steps"] == 0 and usage["accept_lengths"] == []


def test_streaming_concurrent_requests_match_offline(server: Server, offline: dict[str, list[int]]) -> None:
    results: dict[str, Any] = {}

    def one(prompt: str) -> None:
        results[prompt] = post(server.url + "/v1/completions", {
            "prompt": prompt, "max_tokens": 12, "temperature": 0, "ignore_eos": True, "stream": True,
            "return_token_ids": True, "stream_options": {"include_usage": True}})

    threads = [threading.Thread(target=one, args=(p,)) for p in PROMPTS]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    for prompt in PROMPTS:
        code, text = results[prompt]
        assert code == 200
        events = sse_events(text)
        assert events[-1] == "[DONE]"
        chunks = [e for e in events[:-1] if e["choices"]]
        ids = [t for c in chunks for t in c["choices"][0].get("token_ids", [])]
        assert ids == offline[prompt]
        assert "".join(c["choices"][0]["text"] for c in chunks) == server.backend.decode(offline[prompt])
        assert chunks[-1]["choices"][0]["finish_reason"] == "length"
        usage_only = [e for e in events[:-1] if not e["choices"]]
        assert len(usage_only) == 1 and usage_only[0]["usage"]["completion_tokens"] == 12


def test_non_streaming_requests_get_their_tokens_in_two_deltas(server: Server, offline: dict[str, list[int]]) -> None:
    """A caller that answers once (stream=False) gets the first token and then the rest at the finish, the
    same tokens and logprobs as a per-step stream; a stream gets one delta per step."""

    async def deltas(prompt: str, stream: bool) -> list[Any]:
        ids = server.backend.encode(prompt)
        params = SamplingParams(max_tokens=12, temperature=0, ignore_eos=True, logprobs=2)
        return [item async for item in server.backend.generate(ids, params, stream=stream)]

    async def both() -> list[tuple[list[Any], list[Any]]]:
        coalesced = [deltas(p, False) for p in PROMPTS]
        streamed = [deltas(p, True) for p in PROMPTS]
        got = await asyncio.gather(*coalesced, *streamed)  # all six in the same batches
        return list(zip(got[: len(PROMPTS)], got[len(PROMPTS):], strict=True))

    for prompt, (coalesced, streamed) in zip(PROMPTS, server.run(both()), strict=True):
        assert [len(d.token_ids) for d in coalesced] == [1, 11], prompt
        assert [len(d.token_ids) for d in streamed] == [1] * 12, prompt
        assert coalesced[-1].finished and streamed[-1].finished
        assert [t for d in coalesced for t in d.token_ids] == offline[prompt]
        assert [t for d in streamed for t in d.token_ids] == offline[prompt]
        lps = [lp for d in coalesced for lp in d.logprobs]
        assert len(lps) == 12 and lps == [lp for d in streamed for lp in d.logprobs]


def test_chat_completion_uses_the_documented_template(server: Server, model_dir: Path) -> None:
    messages = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "hi"}]
    prompt = chat_prompt(messages)
    assert prompt == "<|system|>\nbe brief\n<|user|>\nhi\n<|assistant|>\n"
    code, body = post(server.url + "/v1/chat/completions", {"messages": messages, "max_tokens": 6, "temperature": 0,
                                                            "ignore_eos": True})
    assert code == 200 and body["object"] == "chat.completion"
    _, plain = post(server.url + "/v1/completions", {"prompt": prompt, "max_tokens": 6, "temperature": 0,
                                                    "ignore_eos": True})
    assert body["choices"][0]["message"] == {"role": "assistant", "content": plain["choices"][0]["text"]}
    assert body["usage"]["prompt_tokens"] == len(prompt.encode()) + 1
    code, text = post(server.url + "/v1/chat/completions", {"messages": messages, "max_tokens": 6, "temperature": 0,
                                                            "ignore_eos": True, "stream": True})
    events = sse_events(text)
    assert events[0]["choices"][0]["delta"] == {"role": "assistant", "content": ""}
    streamed = "".join(e["choices"][0]["delta"].get("content", "") for e in events[:-1])
    assert streamed == plain["choices"][0]["text"]


@pytest.mark.parametrize(
    ("body", "raw", "status", "param"),
    [
        (None, b"{not json", 400, None),
        (None, b"[1, 2]", 400, None),
        ({"prompt": ""}, None, 400, "prompt"),
        ({"prompt": ["a", "b"]}, None, 400, "prompt"),
        ({"prompt": "x", "max_tokens": 0}, None, 400, "max_tokens"),
        ({"prompt": "x", "max_tokens": "9"}, None, 400, "max_tokens"),
        ({"prompt": "x", "max_tokens": 10_000}, None, 400, "max_tokens"),
        ({"prompt": "x", "temperature": -1}, None, 400, "temperature"),
        ({"prompt": "x", "top_p": 0}, None, 400, "top_p"),
        ({"prompt": "x", "n": 2}, None, 400, "n"),
        ({"prompt": "x", "stop": [1]}, None, 400, "stop"),
        ({"prompt": "x", "stream": "yes"}, None, 400, "stream"),
        ({"prompt": "x" * 5000}, None, 400, "prompt"),
        (None, b'{"prompt": "' + b"x" * 70_000 + b'"}', 413, None),
    ],
)
def test_bad_requests_get_json_4xx_and_the_server_keeps_serving(
    server: Server, body: Any, raw: bytes | None, status: int, param: str | None
) -> None:
    code, err = post(server.url + "/v1/completions", body, raw=raw)
    assert code == status, err
    assert isinstance(err["error"]["code"], str) and err["error"]["message"]
    if param is not None:
        assert err["error"]["param"] == param
    code, ok = post(server.url + "/v1/completions", {"prompt": "ok", "max_tokens": 2, "temperature": 0})
    assert code == 200 and ok["usage"]["completion_tokens"] >= 1


def test_chat_without_messages_and_unknown_route_are_json_errors(server: Server) -> None:
    code, err = post(server.url + "/v1/chat/completions", {"messages": "hi"})
    assert code == 400 and err["error"]["param"] == "messages"
    code, text = get(server.url + "/v1/nothing")
    assert code == 404 and json.loads(text)["error"]["code"] == "not_found"


def pool_free(server: Server) -> tuple[int, int]:
    runner = server.backend.engine.runner
    return server.backend.aengine.call_sync(lambda eng: (runner.num_free_pages, runner.num_total_pages))


def test_every_route_answers_json_without_a_500_or_a_traceback_while_the_model_loads(
        model_dir: Path, caplog: pytest.LogCaptureFixture) -> None:
    """Before load() the server already listens (/health says loading); every route it serves, OpenAI's and
    SGLang's, answers a plausible request with a status below 500, or 503 service_unavailable, and logs no
    error. (/tokenize and /detokenize read the tokenizer that loads with the model: they answered a
    500 and logged an AttributeError's traceback.)"""
    body = {"prompt": "x", "text": "x", "tokens": [1, 2], "messages": [{"role": "user", "content": "hi"}],
            "max_tokens": 2}
    s = Server(model_dir)
    try:
        seen = []
        for route in s.server.app.router.routes():
            path = route.resource.canonical if route.resource is not None else ""
            if route.method not in ("GET", "POST") or not path:
                continue
            url = s.url + path.replace("{model_id}", "x")
            code, text = post(url, body) if route.method == "POST" else get(url)
            seen.append(path)
            assert code < 500 or code == 503, (path, code, text)
            if code == 503 and path != "/health":  # /health answers {"status": "loading"}
                assert text["error"]["code"] == "service_unavailable", (path, text)
        assert {"/tokenize", "/detokenize", "/generate", "/v1/completions", "/v1/chat/completions"} <= set(seen)
        errors = [r for r in caplog.records if r.levelname in ("ERROR", "CRITICAL") or r.exc_info]
        assert not errors, [r.getMessage() for r in errors]
    finally:
        s.close()


@pytest.mark.parametrize("stream", [True, False], ids=["streaming", "unary"])
def test_client_disconnect_aborts_and_frees_pages(server: Server, stream: bool) -> None:
    """Streaming or not (a unary request hears from the engine only at its first token and its end), a
    client that goes away frees its request's pages."""
    free0, total = pool_free(server)
    assert free0 == total
    generated0 = server.backend.aengine.call_sync(lambda eng: eng.stats()["generated_tokens"])
    import http.client

    conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=30)
    conn.request("POST", "/v1/completions", json.dumps({"prompt": "def long(x):", "max_tokens": 1500,
                                                        "temperature": 0, "ignore_eos": True, "stream": stream}),
                 {"Content-Type": "application/json"})
    if stream:
        resp = conn.getresponse()
        assert resp.status == 200
        resp.read1(64)  # the stream is flowing: the request holds pages now
    else:
        deadline = time.monotonic() + 20
        while server.backend.aengine.num_live == 0:  # admitted: it holds pages now
            assert time.monotonic() < deadline, "the unary request was never admitted"
            time.sleep(0.01)
    assert pool_free(server)[0] < total
    conn.sock.close()  # the client goes away mid-stream
    conn.close()
    deadline = time.monotonic() + 20
    while pool_free(server)[0] != total:
        assert time.monotonic() < deadline, "pages of the abandoned request were not freed"
        time.sleep(0.05)
    assert server.backend.aengine.num_live == 0
    generated = server.backend.aengine.call_sync(lambda eng: eng.stats()["generated_tokens"]) - generated0
    assert generated < 1500, "the request ran to its end instead of being aborted"


def test_metrics_and_server_info(server: Server) -> None:
    from prometheus_client.parser import text_string_to_metric_families

    post(server.url + "/v1/completions", {"prompt": "metrics", "max_tokens": 3, "temperature": 0})
    code, text = get(server.url + "/metrics")
    assert code == 200
    values = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            labels = dict(sample.labels)
            assert labels.pop("model_name") == server.backend.model_name  # on every series
            key = sample.name + ("{" + ",".join(f'{k}="{v}"' for k, v in labels.items()) + "}" if labels else "")
            values[key] = sample.value
    assert values['specctl_requests_total{status="length"}'] >= 1
    assert values["specctl_time_to_first_token_seconds_count"] >= 1
    assert values["specctl_generation_tokens_total"] >= 3
    assert values["specctl_kv_pages_capacity"] > 0
    assert 0 <= values["specctl_kv_cache_usage_ratio"] <= 1
    assert "specctl_transfer_bytes_total" in text and "specctl_spec_accepted_tokens_total" in text
    code, body = get(server.url + "/server_info")
    info = json.loads(body)
    assert info["role"] == "colocated" and info["ready"] is True
    assert info["engine"]["total_pages"] == values["specctl_kv_pages_capacity"]
    assert info["fingerprints"]["target"]["weights_hash"]
    assert info["timing"]["steps"] > 0


def test_prometheus_histogram_is_cumulative_and_labelled() -> None:
    from specctl.engine.serve.metrics import Registry

    reg = Registry()
    hist = reg.histogram("x_seconds", "demo", ["role"], buckets=(0.1, 1.0))
    for v in (0.05, 0.5, 0.5, 5.0):
        hist.observe(v, role='a"b')
    count = reg.counter("y_total", "demo")
    count.inc(2)
    lines = reg.render().splitlines()
    assert '# TYPE x_seconds histogram' in lines and "# TYPE y_total counter" in lines
    assert 'x_seconds_bucket{role="a\\"b",le="0.1"} 1' in lines
    assert 'x_seconds_bucket{role="a\\"b",le="1"} 3' in lines
    assert 'x_seconds_bucket{role="a\\"b",le="+Inf"} 4' in lines
    assert 'x_seconds_count{role="a\\"b"} 4' in lines and 'x_seconds_sum{role="a\\"b"} 6.05' in lines
    assert "y_total 2" in lines


def test_launcher_plans_roles_in_pairing_order() -> None:
    from specctl.errors import RuntimeFailure
    from specctl.orchestrate.launcher import roles_to_launch

    assert roles_to_launch(("router", "decode", "prefill")) == ("prefill", "decode", "router")
    assert roles_to_launch(("colocated",)) == ("colocated",)
    with pytest.raises(RuntimeFailure):
        roles_to_launch(("prefill",))
