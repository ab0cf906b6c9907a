"""specctl's own server answers with SGLang's per-request acceptance in SGLang's places, and `bench --url
--trace-out` turns it into a trace `adaptive tune` accepts: against a REAL `specctl serve` (builtin tiny
models, fixed steps 3), one server for the module."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from specctl.adaptive.sglang_trace import from_meta_info, from_sglext, read_sglang_output
from specctl.adaptive.trace import read_trace
from specctl.orchestrate.ports import free_ports

pytestmark = pytest.mark.slow

ENV = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
DATA = Path(__file__).parent / "data" / "sglang_spec"
PROMPT = "def fib(n):\n    if n < 2:"
MODEL = "builtin:tiny-hybrid"


def post(url: str, body: dict[str, Any], timeout: float = 60.0) -> bytes:
    req = urllib.request.Request(url, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=timeout) as r:  # noqa: S310 - loopback
        return bytes(r.read())


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    tmp = tmp_path_factory.mktemp("spec-serve")
    port = free_ports(1)[0]
    log = (tmp / "serve.log").open("wb")
    proc = subprocess.Popen([sys.executable, "-m", "specctl.cli", "serve", "--role", "colocated", "-c",
                             "tiny-colocated", "--set", f"roles.colocated.port={port}", "--set",
                             "speculative.adaptive=null", "--export-metrics-to-file-dir", str(tmp / "metrics")],
                            env=ENV, stdout=log, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 180
        while time.monotonic() < deadline:
            try:
                with urllib.request.urlopen(url + "/health", timeout=2) as r:  # noqa: S310 - loopback
                    if r.status == 200:
                        break
            except OSError:
                pass
            assert proc.poll() is None, (tmp / "serve.log").read_text()[-3000:]
            time.sleep(0.5)
        else:
            pytest.fail("the server never became healthy")
        yield {"url": url, "tmp": tmp}
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        log.close()


def test_native_openai_stream_and_metrics_file_give_the_same_request_line(server: dict[str, Any]) -> None:
    url = server["url"]
    native = json.loads(post(url + "/generate", {"text": PROMPT, "sampling_params": {
        "max_new_tokens": 32, "temperature": 0, "ignore_eos": True}}))
    body = {"model": MODEL, "prompt": PROMPT, "max_tokens": 32, "temperature": 0, "ignore_eos": True,
            "return_spec_tokens_details": True}
    openai = json.loads(post(url + "/v1/completions", body))
    stream = post(url + "/v1/completions", {**body, "stream": True})
    chunks = [json.loads(line[5:]) for line in stream.decode().splitlines()
              if line.startswith("data:") and line.strip() != "data: [DONE]"]
    [ext_chunk] = [c for c in chunks if "sglext" in c]
    assert ext_chunk["choices"] == [] and chunks.index(ext_chunk) == len(chunks) - 1  # no usage asked for

    # SGLang's keys, exactly: spec_tokens_details has its SpecTokensDetails fields, meta_info its spec_ keys
    sglang_details = json.loads((DATA / "completion.json").read_text())["sglext"]["spec_tokens_details"]
    assert set(openai["sglext"]["spec_tokens_details"]) == set(sglang_details)
    sglang_meta = json.loads((DATA / "generate.json").read_text())["meta_info"]
    assert {k for k in sglang_meta if k.startswith("spec_")} <= set(native["meta_info"])

    got = [from_meta_info(native["meta_info"]), *from_sglext(openai), *from_sglext(ext_chunk)]
    assert all(g is not None for g in got)
    shapes = {(g.verify_ct, g.histogram, g.launch_steps) for g in got if g is not None}
    assert len(shapes) == 1, shapes  # greedy: the same run thrice
    verify_ct, hist, launch = shapes.pop()
    assert launch == 3 and sum(hist) == verify_ct > 0
    # the verifies in order (specctl's extra) agree with SGLang's histogram
    assert got[0] is not None and got[0].accepted is not None and len(got[0].accepted) == verify_ct

    # SGLang's metrics file: one line per finished request, the same request lines
    [log] = list((server["tmp"] / "metrics").glob("sglang-request-metrics-*.log"))
    reqs, _, _ = read_sglang_output(log)
    assert len(reqs) >= 3
    assert {(r.steps, r.verify_ct, r.histogram) for r in reqs[-3:]} == {(3, verify_ct, hist)}
    line = json.loads(log.read_text().splitlines()[-1])
    assert isinstance(line["request_parameters"], str) and {"request_received_ts", "e2e_latency"} <= set(line)


def test_bench_trace_out_is_a_trace_tune_accepts(server: dict[str, Any], tmp_path: Path) -> None:
    trace = tmp_path / "t.jsonl"
    out = subprocess.run([sys.executable, "-m", "specctl.cli", "bench", "--url", server["url"], "--dataset-name",
                          "code", "--num-prompts", "8", "--max-concurrency", "2", "--random-output-len", "32",
                          "--trace-out", str(trace), "--no-progress", "--format", "json"],
                         env=ENV, capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-3000:]
    record = json.loads(out.stdout.splitlines()[0])
    assert record["spec_trace"]["requests"] == 8
    lines = [json.loads(x) for x in trace.read_text().splitlines()]
    assert len(lines) == 8 and all(x["steps"] == 3 and x["source"] == "sglext" for x in lines)
    assert all(1 <= x["batch_size"] <= 2 for x in lines)
    assert len(read_trace(trace)) > 0

    cost = tmp_path / "cost.json"
    cost.write_text(json.dumps({"kind": "specctl-cost-model", "version": 1, "step_s": {
        str(b): {str(k): 0.001 * b ** 0.5 * (1 + 0.15 * k) for k in range(8)} for b in (1, 2, 4, 8)}}))
    tuned = subprocess.run([sys.executable, "-m", "specctl.cli", "adaptive", "tune", "tiny-colocated", "--trace",
                            str(trace), "--cost", str(cost), "--format", "json"],
                           env=ENV, capture_output=True, text=True, timeout=600)
    assert tuned.returncode == 0, tuned.stderr[-3000:]
    result = json.loads(tuned.stdout)
    assert result["allowed_steps"] == [0, 1, 2, 3]
    assert any("recorded at steps 3" in n for n in result["notes"])
