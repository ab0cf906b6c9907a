"""SGLang's HTTP surface on a specctl server, and the builtin models' byte-level tokenizer as the SGLang
ecosystem loads it: the real routers, smg and sglang-router (their Rust tokenizers crate), transformers'
AutoTokenizer (what bench_serving uses), each offline from the local directories `/model_info` reports.

Oracles: the tokenizer files give exactly specctl's byte ids (UTF-8 bytes, then the specials); native
`/generate` equals `/v1/completions` token for token, streamed or not; a router in front of the server
returns what the server returns directly, and loads the tokenizer without any hub (smg's `/v1/tokenize`
gives the byte ids).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from specctl.engine.tokenizer import BYTE_BOS, BYTE_EOS, ByteTokenizer
from specctl.schemas.role_config import RoleConfig

from test_serve_http import Server, get, post, sse_events  # isort: skip
from test_serve_pd import free_port, router_ready, wait_for  # isort: skip

pytestmark = pytest.mark.slow

TEXT = 'def f(x):\n    return "é😀" + x  # ok\t\n'
MODELS = Path(__file__).resolve().parents[1] / "engine" / "builtin_models"


class BuiltinServer(Server):
    def __init__(self) -> None:
        import specctl.engine.serve.roles as roles
        from specctl.engine.serve.http import OpenAIServer, start_http

        role = {"name": "colocated", "model": {"target": "builtin:tiny-hybrid", "dtype": "float32", "device": "cpu"},
                "speculative": {"algorithm": "ngram", "num_steps": 3}, "cache": {"page_size": 16, "max_tokens": 4096},
                "serve": {"max_batch_size": 4}, "host": "127.0.0.1", "port": 0}
        import asyncio
        import threading

        self.ctx = roles.RoleContext(deployment=None, role_name="colocated", role=RoleConfig.from_json(role))
        self.backend = roles.EngineBackend(self.ctx)
        self.server = OpenAIServer(self.backend, metrics=self.ctx.metrics)
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()
        self.runner, self.port = self.run(start_http(self.server.app, "127.0.0.1", 0))
        self.url = f"http://127.0.0.1:{self.port}"


@pytest.fixture(scope="module")
def server() -> Iterator[Server]:
    s = BuiltinServer()
    try:
        s.load()
        yield s
    finally:
        s.close()


@pytest.mark.parametrize("model", ["tiny-hybrid", "tiny-draft"])
def test_builtin_tokenizer_files_are_specctls_byte_tokenizer(model: str) -> None:
    from tokenizers import Tokenizer

    ref = ByteTokenizer()
    for directory in (MODELS / model, MODELS / model / "tokenizer"):
        tok = Tokenizer.from_file(str(directory / "tokenizer.json"))
        ids = tok.encode(TEXT, add_special_tokens=False).ids
        assert ids == ref.encode(TEXT)
        assert tok.decode(ids) == TEXT
        assert tok.token_to_id("<|bos|>") == BYTE_BOS and tok.token_to_id("<|eos|>") == BYTE_EOS
        assert tok.decode([BYTE_BOS, *ids, BYTE_EOS], skip_special_tokens=True) == TEXT


def test_autotokenizer_loads_the_reported_tokenizer_path_offline(server: Server) -> None:
    code, raw = get(server.url + "/model_info")
    assert code == 200
    info = json.loads(raw)
    assert Path(info["model_path"]) == (MODELS / "tiny-hybrid").resolve()
    assert info["is_generation"] is True
    script = ("import sys; from transformers import AutoTokenizer; t = AutoTokenizer.from_pretrained(sys.argv[1]); "
              "print(t.encode(sys.argv[2]) == list(sys.argv[2].encode()), t.bos_token_id, t.eos_token_id)")
    res = subprocess.run([sys.executable, "-c", script, info["tokenizer_path"], TEXT], capture_output=True, text=True,
                         timeout=120, env={**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"})
    assert res.returncode == 0, res.stderr
    assert res.stdout.split() == ["True", str(BYTE_BOS), str(BYTE_EOS)]


def test_native_generate_equals_completions_streamed_or_not(server: Server) -> None:
    prompt = "import os\n"
    code, oai = post(server.url + "/v1/completions", {"prompt": prompt, "max_tokens": 16, "temperature": 0,
                                                      "ignore_eos": True, "return_token_ids": True})
    assert code == 200, oai
    body = {"text": prompt, "sampling_params": {"max_new_tokens": 16, "temperature": 0, "ignore_eos": True}}
    code, native = post(server.url + "/generate", body)
    assert code == 200, native
    assert native["output_ids"] == oai["choices"][0]["token_ids"] and native["text"] == oai["choices"][0]["text"]
    meta = native["meta_info"]
    assert meta["prompt_tokens"] == oai["usage"]["prompt_tokens"] and meta["completion_tokens"] == 16
    assert meta["finish_reason"] == {"type": "length"}
    assert meta["spec_verify_ct"] == oai["usage"]["spec_verify_steps"] >= 1  # ngram speculation ran
    code, text = post(server.url + "/generate", {**body, "stream": True})
    events = sse_events(text)
    assert code == 200 and events[-1] == "[DONE]"
    chunks = events[:-1]
    assert chunks[-1]["text"] == native["text"] and chunks[-1]["output_ids"] == native["output_ids"]
    assert all(chunks[i]["text"] == chunks[-1]["text"][: len(chunks[i]["text"])] for i in range(len(chunks)))
    code, ids_body = post(server.url + "/generate", {"input_ids": native["output_ids"][:3],
                                                     "sampling_params": {"max_new_tokens": 2}})
    assert code == 200 and ids_body["meta_info"]["prompt_tokens"] == 3


def test_tokenize_detokenize_models_load_and_server_info(server: Server) -> None:
    code, tok = post(server.url + "/tokenize", {"prompt": TEXT})
    assert code == 200 and tok["tokens"] == [BYTE_BOS, *TEXT.encode()] and tok["count"] == len(tok["tokens"])
    code, raw = post(server.url + "/tokenize", {"prompt": TEXT, "add_special_tokens": False})
    assert raw["tokens"] == list(TEXT.encode())
    code, detok = post(server.url + "/detokenize", {"tokens": tok["tokens"]})
    assert code == 200 and detok["text"] == TEXT
    code, err = post(server.url + "/detokenize", {"tokens": "abc"})
    assert code == 400 and err["error"]["param"] == "tokens"
    code, raw = get(server.url + "/v1/models/builtin:tiny-hybrid")
    assert code == 200 and json.loads(raw)["id"] == "builtin:tiny-hybrid"
    code, raw = get(server.url + "/v1/models/other")
    assert code == 404
    code, raw = get(server.url + "/get_load")
    load = json.loads(raw)
    assert code == 200 and isinstance(load, list) and set(load[0]) >= {"dp_rank", "num_reqs", "num_waiting_reqs"}
    code, raw = get(server.url + "/server_info")
    si = json.loads(raw)
    assert si["model_path"] == str((MODELS / "tiny-hybrid").resolve()) and si["version"]
    assert si["disaggregation_mode"] == "null" and si["speculative_algorithm"] == "NGRAM"
    assert si["internal_states"][0]["avg_spec_accept_length"] >= 1.0


@pytest.mark.parametrize("body", [
    {"text": ""}, {"input_ids": []}, {"input_ids": [1, True]}, {"text": "x", "sampling_params": []},
    {"text": "x", "bootstrap_room": 3}, {"text": "x", "bootstrap_host": "h", "bootstrap_port": 0, "bootstrap_room": 1},
    {"text": "x", "stream": "yes"}, {"input_ids": [999999]}, {"input_ids": [-5]},
])
def test_malformed_native_requests_are_4xx(server: Server, body: dict[str, Any]) -> None:
    code, err = post(server.url + "/generate", body)
    assert code == 400, err


@pytest.mark.parametrize(("body", "param"), [
    ({"input_ids": [1] * 5000}, "input_ids"), ({"text": "x" * 5000}, "text"),
    ({"text": "x", "sampling_params": {"max_new_tokens": "9"}}, "sampling_params.max_new_tokens"),
    ({"text": "x", "sampling_params": {"temperature": 9}}, "sampling_params.temperature"),
    ({"text": "x", "sampling_params": {"stop": 5}}, "sampling_params.stop"),
])
def test_native_errors_name_the_field_as_the_request_spelled_it(server: Server, body: dict[str, Any],
                                                                 param: str) -> None:
    code, err = post(server.url + "/generate", body)
    assert code == 400 and err["error"]["param"] == param, err


@pytest.mark.parametrize("launch", [["smg", "launch"], ["sglang_router.launch_router"]], ids=["smg", "sglang-router"])
def test_the_router_fronts_the_server_and_loads_its_tokenizer_offline(server: Server, tmp_path: Path,
                                                                      launch: list[str]) -> None:
    port = free_port()
    log = tmp_path / "router.log"
    # smg loads a tokenizer only when given one (it routes HTTP workers without): the directory the server
    # reports in /model_info, as a user of smg's tokenizer-aware policies would pass it.
    tokenizer_dir = json.loads(get(server.url + "/model_info")[1])["tokenizer_path"]
    tokenizer = ["--model-path", tokenizer_dir] if launch[0] == "smg" else []
    with open(log, "wb") as out:
        router = subprocess.Popen(
            [sys.executable, "-m", *launch, "--worker-urls", server.url, "--host", "127.0.0.1",
             "--port", str(port), "--prometheus-host", "127.0.0.1", "--prometheus-port", str(free_port()),
             "--shutdown-grace-period-secs", "1", "--log-level", "info", *tokenizer],
            stdout=out, stderr=subprocess.STDOUT,
            env={**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"})
        try:
            url = f"http://127.0.0.1:{port}"
            wait_for(lambda: router_ready(url), 60, "the router ready")
            body = {"prompt": "class A:\n", "max_tokens": 12, "temperature": 0, "ignore_eos": True}
            code, direct = post(server.url + "/v1/completions", body)
            code2, routed = post(url + "/v1/completions", {"model": "builtin:tiny-hybrid", **body})
            assert code == code2 == 200, routed
            assert routed["choices"][0]["text"] == direct["choices"][0]["text"]
            wait_for(lambda: "Loading tokenizer" in log.read_text(errors="replace"), 30, "the router's tokenizer")
            if launch[0] == "smg":  # its tokenizer gives specctl's byte ids
                code, tok = post(url + "/v1/tokenize", {"model": tokenizer_dir, "prompt": TEXT})
                assert code == 200 and tok["tokens"] == list(TEXT.encode()), tok
        finally:
            router.terminate()
            router.wait(30)
    text = log.read_text(errors="replace")
    assert "Failed to load tokenizer" not in text and "huggingface.co" not in text, text[-2000:]
