"""Hostile and careless requests against a real running server (colocated builtin engine, real HTTP on
127.0.0.1, random tiny model).

Oracles, for every request class: the status is the right 4xx (never 5xx), the OpenAI error object names
the offending field in `param` with a string `code`, the server still answers a valid request right
after, and nothing a client sent left a traceback (or any ERROR record) in the logs. The 12 classes
that used to answer 500 or 503 are named `was500_*` / `was503_*`. Connections: a client that never
finishes its headers or its body is cut off within the timeout, and one address cannot hold more than
its share of connections.
"""

from __future__ import annotations

import json
import logging
import os
import socket
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch

from specctl.engine.checkpoint import write_random_model

from test_serve_http import Server as ServeHttpServer  # isort: skip

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

VOCAB = "<vocab>"  # replaced by the served model's vocabulary size
DEEP = b'{"prompt": ' + b"[" * 5000 + b"]" * 5000 + b"}"
C, CH = "/v1/completions", "/v1/chat/completions"
MSG = [{"role": "user", "content": "hi"}]


def chat(**extra: Any) -> dict[str, Any]:
    return {"messages": MSG, "max_tokens": 2, **extra}


def comp(**extra: Any) -> dict[str, Any]:
    return {"prompt": "x", "max_tokens": 2, **extra}


# (name, path, JSON body or raw bytes, expected status, expected param)
CASES: list[tuple[str, str, Any, int, str | None]] = [
    # the 12 that failed: 7 answered 500, 5 answered 503
    ("was500_json_nested_5000_deep", C, DEEP, 400, None),
    ("was500_lone_surrogate_prompt", C, b'{"prompt": "\\ud800", "max_tokens": 2}', 400, "prompt"),
    ("was500_lone_surrogate_chat_content", CH, b'{"messages": [{"role": "user", "content": "a\\udfff"}]}', 400,
     "messages"),
    ("was500_prompt_id_over_2_64", C, b'{"prompt": [' + str(1 << 70).encode() + b"]}", 400, "prompt"),
    ("was500_top_k_over_2_64", C, comp(top_k=1 << 70), 400, "top_k"),
    ("was500_seed_over_2_64", C, comp(seed=1 << 70), 400, "seed"),
    ("was500_content_part_text_is_a_number", CH, chat(messages=[{"role": "user", "content": [
        {"type": "text", "text": 5}]}]), 400, "messages[0].content[0].text"),
    ("was503_temperature_nan", C, b'{"prompt": "x", "temperature": NaN}', 400, "temperature"),
    ("was503_top_p_nan", C, b'{"prompt": "x", "top_p": NaN}', 400, "top_p"),
    ("was503_token_id_out_of_vocab", C, {"prompt": [999999]}, 400, "prompt"),
    ("was503_token_id_negative", C, {"prompt": [-5]}, 400, "prompt"),
    ("was503_chat_temperature_nan", CH, b'{"messages": [{"role": "user", "content": "hi"}], "temperature": NaN}',
     400, "temperature"),
    # the body as a whole
    ("not_json", C, b"{not json", 400, None),
    ("json_array", C, b"[1, 2]", 400, None),
    ("json_string", C, b'"prompt"', 400, None),
    ("json_null", C, b"null", 400, None),
    ("empty_body", C, b"", 400, None),
    ("not_utf8", C, b'{"prompt": "\xff\xfe"}', 400, None),
    ("nested_40_deep", C, b'{"prompt": "x", "user": ' + b"[" * 40 + b"]" * 40 + b"}", 400, "user"),
    ("lone_surrogate_in_a_key", C, b'{"\\udc00": 1, "prompt": "x"}', 400, None),
    ("lone_surrogate_in_an_extension_field", C, b'{"prompt": "x", "user": "\\ud83d"}', 400, "user"),
    ("integer_of_5000_digits", C, b'{"prompt": "x", "seed": ' + b"9" * 5000 + b"}", 400, None),
    ("temperature_infinity", C, b'{"prompt": "x", "temperature": Infinity}', 400, "temperature"),
    ("max_tokens_1e999", C, b'{"prompt": "x", "max_tokens": 1e999}', 400, "max_tokens"),
    ("body_too_large", C, b'{"prompt": "' + b"x" * 70_000 + b'"}', 413, None),
    # prompt
    ("prompt_missing", C, {"max_tokens": 2}, 400, "prompt"),
    ("prompt_empty", C, {"prompt": ""}, 400, "prompt"),
    ("prompt_empty_list", C, {"prompt": []}, 400, "prompt"),
    ("prompt_number", C, {"prompt": 5}, 400, "prompt"),
    ("prompt_object", C, {"prompt": {"text": "x"}}, 400, "prompt"),
    ("prompt_batch_of_two", C, {"prompt": ["a", "b"]}, 400, "prompt"),
    ("prompt_batch_of_two_id_lists", C, {"prompt": [[1, 2], [3]]}, 400, "prompt"),
    ("prompt_id_equal_to_vocab_size", C, {"prompt": [VOCAB]}, 400, "prompt"),
    ("prompt_id_bool", C, {"prompt": [True]}, 400, "prompt"),
    ("prompt_id_float", C, {"prompt": [1.5]}, 400, "prompt"),
    ("prompt_id_string", C, {"prompt": [1, "2"]}, 400, "prompt"),
    ("prompt_longer_than_context", C, {"prompt": "x" * 5000}, 400, "prompt"),
    # fits the model's 4096 positions, not the server's 2048-token KV pool: the client's to fix, a 400
    ("prompt_beyond_the_kv_pool", C, {"prompt": "x" * 2500}, 400, "prompt"),
    ("max_tokens_beyond_the_kv_pool", C, {"prompt": "x" * 1500, "max_tokens": 1000}, 400, "max_tokens"),
    # lengths
    ("max_tokens_zero", C, comp(max_tokens=0), 400, "max_tokens"),
    ("max_tokens_negative", C, comp(max_tokens=-1), 400, "max_tokens"),
    ("max_tokens_string", C, comp(max_tokens="9"), 400, "max_tokens"),
    ("max_tokens_fraction", C, comp(max_tokens=1.5), 400, "max_tokens"),
    ("max_tokens_bool", C, comp(max_tokens=True), 400, "max_tokens"),
    ("max_tokens_over_2_64", C, comp(max_tokens=1 << 70), 400, "max_tokens"),
    ("max_tokens_beyond_context", C, comp(max_tokens=10_000), 400, "max_tokens"),
    ("max_completion_tokens_zero", CH, chat(max_completion_tokens=0), 400, "max_completion_tokens"),
    # sampling ranges and types
    ("temperature_negative", C, comp(temperature=-1), 400, "temperature"),
    ("temperature_3", C, comp(temperature=3), 400, "temperature"),
    ("temperature_string", C, comp(temperature="hot"), 400, "temperature"),
    ("temperature_bool", C, comp(temperature=True), 400, "temperature"),
    ("top_p_zero", C, comp(top_p=0), 400, "top_p"),
    ("top_p_above_one", C, comp(top_p=1.5), 400, "top_p"),
    ("top_p_negative", C, comp(top_p=-0.1), 400, "top_p"),
    ("top_k_minus_two", C, comp(top_k=-2), 400, "top_k"),
    ("top_k_fraction", C, comp(top_k=1.5), 400, "top_k"),
    ("top_k_string", C, comp(top_k="5"), 400, "top_k"),
    ("seed_string", C, comp(seed="x"), 400, "seed"),
    ("seed_fraction", C, comp(seed=1.5), 400, "seed"),
    ("seed_below_int64", C, comp(seed=-(1 << 63) - 1), 400, "seed"),
    ("presence_penalty_3", C, comp(presence_penalty=3), 400, "presence_penalty"),
    ("frequency_penalty_minus_2_5", C, comp(frequency_penalty=-2.5), 400, "frequency_penalty"),
    ("presence_penalty_nan", C, b'{"prompt": "x", "presence_penalty": NaN}', 400, "presence_penalty"),
    ("logit_bias_list", C, comp(logit_bias=[1]), 400, "logit_bias"),
    ("logit_bias_key_not_an_id", C, comp(logit_bias={"abc": 1}), 400, "logit_bias"),
    ("logit_bias_key_out_of_vocab", C, comp(logit_bias={"999999": 1}), 400, "logit_bias"),
    ("logit_bias_value_200", C, comp(logit_bias={"5": 200}), 400, "logit_bias"),
    ("repetition_penalty", C, comp(repetition_penalty=1.2), 400, "repetition_penalty"),
    ("stop_number_list", C, comp(stop=[1]), 400, "stop"),
    ("stop_empty_string", C, comp(stop=""), 400, "stop"),
    ("stop_seventeen", C, comp(stop=[str(i) for i in range(17)]), 400, "stop"),
    ("stop_object", C, comp(stop={"a": 1}), 400, "stop"),
    ("n_two", C, comp(n=2), 400, "n"),
    ("n_zero", C, comp(n=0), 400, "n"),
    ("n_string", C, comp(n="1"), 400, "n"),
    ("ignore_eos_string", C, comp(ignore_eos="no"), 400, "ignore_eos"),
    ("return_token_ids_number", C, comp(return_token_ids=1), 400, "return_token_ids"),
    ("echo_string", C, comp(echo="yes"), 400, "echo"),
    ("logprobs_six", C, comp(logprobs=6), 400, "logprobs"),
    ("logprobs_negative", C, comp(logprobs=-1), 400, "logprobs"),
    # streaming options
    ("stream_string", C, comp(stream="yes"), 400, "stream"),
    ("stream_options_string", C, comp(stream=True, stream_options="x"), 400, "stream_options"),
    ("stream_options_without_stream", C, comp(stream_options={"include_usage": True}), 400, "stream_options"),
    ("include_usage_string", C, comp(stream=True, stream_options={"include_usage": "yes"}), 400,
     "stream_options.include_usage"),
    # refused, never ignored
    ("best_of_two", C, comp(best_of=2), 400, "best_of"),
    ("suffix", C, comp(suffix="}"), 400, "suffix"),
    ("response_format_json", CH, chat(response_format={"type": "json_object"}), 400, "response_format"),
    ("response_format_string", CH, chat(response_format="json"), 400, "response_format"),
    ("tools", CH, chat(tools=[{"type": "function", "function": {"name": "f"}}]), 400, "tools"),
    ("tool_choice_auto", CH, chat(tool_choice="auto"), 400, "tool_choice"),
    ("functions", CH, chat(functions=[{"name": "f"}]), 400, "functions"),
    # model
    ("model_unknown", C, comp(model="gpt-4"), 404, "model"),
    ("model_unknown_chat", CH, chat(model="gpt-4"), 404, "model"),
    ("model_number", C, comp(model=5), 400, "model"),
    # chat messages
    ("messages_missing", CH, {"max_tokens": 2}, 400, "messages"),
    ("messages_string", CH, {"messages": "hi"}, 400, "messages"),
    ("messages_empty", CH, {"messages": []}, 400, "messages"),
    ("message_not_an_object", CH, {"messages": [5]}, 400, "messages[0]"),
    ("message_without_role", CH, {"messages": [{"content": "hi"}]}, 400, "messages[0].role"),
    ("message_unknown_role", CH, {"messages": [{"role": "wizard", "content": "hi"}]}, 400, "messages[0].role"),
    ("message_content_number", CH, {"messages": [{"role": "user", "content": 5}]}, 400, "messages[0].content"),
    ("content_part_image", CH, {"messages": [{"role": "user", "content": [
        {"type": "image_url", "image_url": {"url": "http://x"}}]}]}, 400, "messages[0].content[0].type"),
    ("content_part_not_an_object", CH, {"messages": [{"role": "user", "content": ["hi"]}]}, 400,
     "messages[0].content[0]"),
    ("chat_logprobs_string", CH, chat(logprobs="yes"), 400, "logprobs"),
    ("chat_top_logprobs_30", CH, chat(logprobs=True, top_logprobs=30), 400, "top_logprobs"),
    ("chat_top_logprobs_without_logprobs", CH, chat(top_logprobs=3), 400, "top_logprobs"),
]


# ---------------------------------------------------------------------------------------------- fixtures
class LogRecorder(logging.Handler):
    """Every log record of the process while the server runs (the test's captured logs)."""

    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)

    def faults(self, since: int) -> list[str]:
        return [f"{r.name} {r.levelname}: {r.getMessage()}" for r in self.records[since:]
                if r.exc_info or r.levelno >= logging.ERROR or "Traceback" in r.getMessage()]


class Server(ServeHttpServer):
    """test_serve_http's server (an OpenAIServer over a real EngineBackend on a private event-loop thread),
    loaded and ready at once."""

    def __init__(self, model_dir: Path, **limits: Any) -> None:
        super().__init__(model_dir, **limits)
        self.load()


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    torch.manual_seed(0)
    return write_random_model(tmp_path_factory.mktemp("hostile") / "target")


@pytest.fixture(scope="module")
def logs() -> Iterator[LogRecorder]:
    recorder = LogRecorder()
    root = logging.getLogger()
    old_level = root.level
    root.addHandler(recorder)
    root.setLevel(logging.DEBUG)
    try:
        yield recorder
    finally:
        root.removeHandler(recorder)
        root.setLevel(old_level)


@pytest.fixture(scope="module")
def server(model_dir: Path, logs: LogRecorder) -> Iterator[Server]:
    s = Server(model_dir)
    try:
        yield s
    finally:
        s.close()


def send(url: str, path: str, body: Any, *, method: str = "POST") -> tuple[int, Any]:
    data = body if isinstance(body, bytes) else (None if body is None else json.dumps(body).encode())
    req = urllib.request.Request(url + path, data=data, method=method, headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=60) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()


def still_serving(server: Server) -> None:
    code, text = send(server.url, C, {"prompt": "ok", "max_tokens": 1, "temperature": 0})
    assert code == 200, text
    assert json.loads(text)["usage"]["completion_tokens"] == 1


# ---------------------------------------------------------------------------------------------- tests
def test_there_are_at_least_89_classes_and_the_12_named_ones() -> None:
    names = [c[0] for c in CASES]
    assert len(names) == len(set(names)) and len(names) >= 89
    assert sum(n.startswith(("was500_", "was503_")) for n in names) == 12


@pytest.mark.parametrize(("name", "path", "body", "status", "param"), CASES, ids=[c[0] for c in CASES])
def test_bad_request_is_a_4xx_naming_the_field(server: Server, logs: LogRecorder, name: str, path: str, body: Any,
                                               status: int, param: str | None) -> None:
    vocab = server.backend.tokenizer.vocab_size
    if isinstance(body, dict) and body.get("prompt") == [VOCAB]:
        body = {**body, "prompt": [vocab]}
    since = len(logs.records)
    code, text = send(server.url, path, body)
    assert code == status, text
    err = json.loads(text)["error"]
    assert set(err) == {"message", "type", "param", "code"}
    assert err["param"] == param, err
    assert isinstance(err["code"], str) and err["code"] and err["message"]
    assert err["type"] == "invalid_request_error"
    if status == 404:
        assert err["code"] == "model_not_found"
    # The same request streamed is refused the same way, before any event is sent.
    if isinstance(body, dict) and "stream" not in body and "stream_options" not in body:
        code, text = send(server.url, path, {**body, "stream": True})
        assert code == status and json.loads(text)["error"]["param"] == param, text
    still_serving(server)
    assert logs.faults(since) == []


@pytest.mark.parametrize(
    ("name", "method", "path", "status", "code"),
    [("unknown_route", "POST", "/v1/nothing", 404, "not_found"),
     ("wrong_method", "GET", C, 405, "method_not_allowed"),
     ("unknown_model_card", "GET", "/v1/models/gpt-4", 404, "model_not_found")],
)
def test_routes_answer_json_errors(server: Server, logs: LogRecorder, name: str, method: str, path: str,
                                   status: int, code: str) -> None:
    since = len(logs.records)
    got, text = send(server.url, path, None, method=method)
    assert got == status and json.loads(text)["error"]["code"] == code
    assert logs.faults(since) == []


@pytest.mark.parametrize(
    ("name", "raw"),
    [("garbage_request_line", b"GARBAGE\r\n\r\n"),
     ("header_line_too_long", b"GET /health HTTP/1.1\r\nHost: x\r\nX-Big: " + b"a" * 20_000 + b"\r\n\r\n"),
     ("bad_content_length", b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: abc\r\n\r\n{}"),
     ("bad_chunk_size", b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n"
                        b"{}\r\n0\r\n\r\n")],
)
def test_malformed_http_is_a_4xx(server: Server, logs: LogRecorder, name: str, raw: bytes) -> None:
    since = len(logs.records)
    with socket.create_connection(("127.0.0.1", server.port), timeout=10) as sock:
        sock.sendall(raw)
        reply = sock.recv(4096)
    status = int(reply.split(b" ", 2)[1])
    assert 400 <= status < 500, reply[:200]
    still_serving(server)
    assert logs.faults(since) == []


def test_openai_shapes_models_card_usage_and_role_chunk(server: Server) -> None:
    model = server.backend.model_name
    code, text = send(server.url, "/v1/models/" + model, None, method="GET")
    assert code == 200 and json.loads(text)["id"] == model
    # usage: absent from a stream without include_usage, once (choices: []) with it
    for include, expected in ((None, 0), (False, 0), (True, 1)):
        body: dict[str, Any] = comp(stream=True, max_tokens=3, temperature=0)
        if include is not None:
            body["stream_options"] = {"include_usage": include}
        code, text = send(server.url, C, body)
        events = [json.loads(b[6:]) for b in text.split("\n\n") if b.startswith("data: {")]
        with_usage = [e for e in events if "usage" in e]
        assert len(with_usage) == expected
        if expected:
            assert with_usage[0]["choices"] == [] and with_usage[0] is events[-1]
            assert with_usage[0]["usage"]["completion_tokens"] == 3
    code, text = send(server.url, CH, chat(stream=True))
    first = json.loads(text.split("\n\n")[0][6:])
    assert first["choices"][0]["delta"] == {"role": "assistant", "content": ""}
    # echo: the prompt comes back in front of the completion, streamed or not
    code, text = send(server.url, C, comp(prompt="def f(", echo=True, temperature=0, max_tokens=3))
    plain = json.loads(send(server.url, C, comp(prompt="def f(", temperature=0, max_tokens=3))[1])
    assert json.loads(text)["choices"][0]["text"] == "def f(" + plain["choices"][0]["text"]
    code, text = send(server.url, C, comp(prompt="def f(", echo=True, temperature=0, max_tokens=3, stream=True))
    events = [json.loads(b[6:]) for b in text.split("\n\n") if b.startswith("data: {")]
    assert "".join(e["choices"][0]["text"] for e in events if e["choices"]) == "def f(" + plain["choices"][0]["text"]
    # accepted: top_k -1 (off, as vLLM and SGLang spell it), penalties of 0, an empty logit_bias, text format
    for extra in ({"top_k": -1}, {"presence_penalty": 0, "frequency_penalty": 0.0}, {"logit_bias": {}},
                  {"best_of": 1, "suffix": None}, {"seed": (1 << 64) - 1, "temperature": 1.0},
                  {"seed": -(1 << 63), "temperature": 2.0}, {"top_k": 1 << 31, "temperature": 1.0},
                  {"max_tokens": 16.0}, {"prompt": [[1, 2, 3]]}, {"prompt": ["one prompt in a batch of one"]}):
        code, text = send(server.url, C, comp(**extra))
        assert code == 200, (extra, text)
    assert send(server.url, CH, chat(response_format={"type": "text"}, tool_choice="none"))[0] == 200


def _closed_within(sock: socket.socket, seconds: float) -> float:
    """Seconds until the server closes `sock` (reading whatever it answered first)."""
    t0 = time.monotonic()
    sock.settimeout(seconds)
    while True:
        data = sock.recv(4096)
        if not data:
            return time.monotonic() - t0


def test_slowloris_connections_are_closed_within_the_timeout(model_dir: Path, logs: LogRecorder) -> None:
    s = Server(model_dir, header_timeout_s=1.0, body_timeout_s=1.0, max_connections=6)
    socks: list[socket.socket] = []
    try:
        since = len(logs.records)
        idle = [socket.create_connection(("127.0.0.1", s.port), timeout=5) for _ in range(2)]
        partial_headers = [socket.create_connection(("127.0.0.1", s.port), timeout=5) for _ in range(2)]
        partial_body = [socket.create_connection(("127.0.0.1", s.port), timeout=5) for _ in range(2)]
        socks = idle + partial_headers + partial_body
        for sock in partial_headers:
            sock.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Ty")
        for sock in partial_body:
            sock.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                         b"Content-Length: 100\r\n\r\n{\"prompt\": ")
        time.sleep(0.2)  # the six are accepted: the server is at its connection budget
        # a real request is served all the same: the connection idle longest makes room for it
        with socket.create_connection(("127.0.0.1", s.port), timeout=5) as extra:
            extra.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n")
            reply = extra.recv(4096)
            assert reply.startswith(b"HTTP/1.1 200"), reply[:100]
        assert _closed_within(idle[0], 1.0) < 1.0  # the evicted one
        for sock in idle[1:] + partial_headers + partial_body:
            assert _closed_within(sock, 5.0) < 3.0
        still_serving(s)
        assert logs.faults(since) == []
    finally:
        for sock in socks:
            sock.close()
        s.close()


def test_body_timeout_answers_408(model_dir: Path) -> None:
    s = Server(model_dir, header_timeout_s=5.0, body_timeout_s=0.5)
    try:
        with socket.create_connection(("127.0.0.1", s.port), timeout=5) as sock:
            sock.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                         b"Content-Length: 100\r\n\r\n{\"prompt\": ")
            reply = b""
            while b"}" not in reply:
                data = sock.recv(4096)
                if not data:
                    break
                reply += data
        assert reply.startswith(b"HTTP/1.1 408"), reply[:200]
        assert json.loads(reply.split(b"\r\n\r\n", 1)[1])["error"]["code"] == "request_timeout"
    finally:
        s.close()


def test_a_client_that_disconnects_mid_request_is_a_debug_line_not_a_traceback(server: Server,
                                                                               logs: LogRecorder) -> None:
    since = len(logs.records)
    for _ in range(3):
        with socket.create_connection(("127.0.0.1", server.port), timeout=5) as sock:
            sock.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                         b"Content-Length: 100\r\n\r\n{\"prompt\": ")
            time.sleep(0.2)  # the handler is reading the body when the client goes
    still_serving(server)
    assert logs.faults(since) == []
    assert any("disconnected" in r.getMessage() for r in logs.records[since:] if r.levelno == logging.DEBUG)


def test_a_stream_whose_backend_fails_midway_still_ends_with_an_error_event(model_dir: Path) -> None:
    s = Server(model_dir)
    real = s.backend.generate

    async def failing(prompt_ids: list[int], params: Any, *, route: Any = None, stream: bool = True) -> Any:
        """The real engine's stream, then a bug: a failure after the first chunk went out."""
        async for item in real(prompt_ids, params, route=route, stream=stream):
            yield item
            raise RuntimeError("the backend broke mid-stream")

    s.backend.generate = failing  # type: ignore[method-assign]
    try:
        req = urllib.request.Request(s.url + C, data=json.dumps(comp(max_tokens=8, stream=True, ignore_eos=True,
                                                                        temperature=0)).encode(),
                                     headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(req, timeout=60) as r:
            events = [line[6:].decode() for line in r.read().splitlines() if line.startswith(b"data: ")]
        assert events[-1] == "[DONE]", events
        error = json.loads(events[-2])["error"]
        assert error["code"] == "internal_error" and "broke mid-stream" in error["message"], events
    finally:
        s.close()
