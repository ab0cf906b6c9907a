"""`specctl bench` speaks its peers' language: its TTFT, TPOT, ITL and E2E agree within 5% with SGLang's
bench_serving on a stub with known timings, and its record carries vLLM's names for the same numbers.

bench_serving itself needs SGLang's package (not installable by setup.sh on a fresh clone), so this
test implements its definitions from its source (sglang 0.5.23 `benchmark/serving.py`:
`async_request_openai_completions` and `calculate_metrics`, backend `sglang-oai` with a speculative
server) in `bench_serving_metrics` and drives them with their own minimal streaming client:
- a chunk counts when `choices[0].text` is non-empty; TTFT is its first arrival minus the send time;
  the gaps after it are `itl`, with the chunk text kept; `latency` is the time of the last line read;
- TPOT = (latency - ttft) / (output_len - 1); ITL, when the server reports an accept length, is each
  gap divided by the tokens of its chunk's text, once per token (`retokenized_itls`); percentiles are
  numpy's. The stub's text is one character per token, so re-tokenizing is counting characters.
"""

from __future__ import annotations

import asyncio
import json
import math
import time
from collections.abc import Iterator
from typing import Any

import aiohttp
import numpy as np
import pytest

from specctl.bench.config import BenchConfig, LoadPoint, WorkloadConfig
from specctl.bench.record import VLLM_ALIASES
from specctl.bench.runner import run_bench
from specctl.bench.stub_server import StubBehaviour, StubServer

TTFT_S, GAP_S, PER_CHUNK, OUT, N = 0.060, 0.030, 3, 13, 8  # 5 chunks: 3+3+3+3+1 tokens


@pytest.fixture(scope="module")
def stub() -> Iterator[StubServer]:
    with StubServer(StubBehaviour(ttft_s=TTFT_S, itl_s=GAP_S, tokens_per_chunk=PER_CHUNK)) as server:
        yield server


async def _bench_serving_request(session: aiohttp.ClientSession, url: str, model: str) -> dict[str, Any]:
    """bench_serving's streaming completion request, as its source reads the stream."""
    payload = {"model": model, "prompt": "x" * 32, "best_of": 1, "max_tokens": OUT, "stream": True,
               "temperature": 0.0, "ignore_eos": True}
    out: dict[str, Any] = {"ttft": 0.0, "itl": [], "text_chunks": [], "output_len": OUT}
    st = time.perf_counter()
    recent = st
    async with session.post(url + "/v1/completions", json=payload) as resp:
        assert resp.status == 200
        async for raw in resp.content:
            line = raw.strip()
            if not line:
                continue
            chunk = line.decode().removeprefix("data: ")
            latency = time.perf_counter() - st
            if chunk == "[DONE]":
                continue
            data = json.loads(chunk)
            text = data["choices"][0]["text"]
            if text:
                now = time.perf_counter()
                if out["ttft"] == 0.0:
                    out["ttft"] = now - st
                else:
                    out["text_chunks"].append(text)
                    out["itl"].append(now - recent)
                recent = now
                out["output_len"] = (data.get("usage") or {}).get("completion_tokens", out["output_len"])
    out["latency"] = latency
    return out


def bench_serving_metrics(outputs: list[dict[str, Any]]) -> dict[str, float]:
    """calculate_metrics' TTFT, TPOT, ITL (retokenized: accept length reported) and E2E, in ms."""
    ttfts, tpots, itls, e2es = [], [], [], []
    for o in outputs:
        if o["output_len"] > 1:
            tpots.append((o["latency"] - o["ttft"]) / (o["output_len"] - 1))
        for gap, text in zip(o["itl"], o["text_chunks"], strict=True):
            n = len(text)  # re-tokenized: one token per character on the stub
            itls.extend([gap / n] * n)
        ttfts.append(o["ttft"])
        e2es.append(o["latency"])
    out: dict[str, float] = {}
    for name, values in (("ttft", ttfts), ("tpot", tpots), ("itl", itls), ("e2e_latency", e2es)):
        a = np.asarray(values) * 1000
        out[f"mean_{name}_ms"] = float(np.mean(a))
        out[f"median_{name}_ms"] = float(np.median(a))
        out[f"p99_{name}_ms"] = float(np.percentile(a, 99))
    return out


async def _bench_serving_run(url: str, model: str) -> dict[str, float]:
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=30)) as session:  # every read bounded
        outputs = [await _bench_serving_request(session, url, model) for _ in range(N)]  # one at a time
    return bench_serving_metrics(outputs)


def test_ttft_tpot_itl_e2e_agree_with_bench_serving_within_5_percent(stub: StubServer) -> None:
    reference = asyncio.run(_bench_serving_run(stub.url, stub.behaviour.model))
    cfg = BenchConfig(url=stub.url, workload=WorkloadConfig(num_prompts=N, random_input_len=32, random_output_len=OUT),
                      points=(LoadPoint(math.inf, 1),), warmup_requests=0)
    (run,) = run_bench(cfg)
    rec = run.record
    assert rec["completed"] == N
    for key, want in reference.items():
        if key.startswith("p99"):
            continue  # tails of 8 requests are a few scheduler hiccups, not a definition
        assert rec[key] == pytest.approx(want, rel=0.05), (key, rec[key], want)
    # the definitions themselves, on the known timings: per-token ITL is the chunk gap over its tokens
    assert rec["median_itl_ms"] == pytest.approx(GAP_S * 1000 / PER_CHUNK, rel=0.1)
    assert rec["median_chunk_gap_ms"] == pytest.approx(GAP_S * 1000, rel=0.1)  # the raw gap, its own field
    chunks = math.ceil(OUT / PER_CHUNK)
    assert rec["median_tpot_ms"] == pytest.approx((chunks - 1) * GAP_S * 1000 / (OUT - 1), rel=0.1)
    assert rec["median_e2e_latency_ms"] == pytest.approx((TTFT_S + (chunks - 1) * GAP_S) * 1000, rel=0.1)


def test_record_carries_vllm_names_and_the_sampling_settings(stub: StubServer) -> None:
    cfg = BenchConfig(url=stub.url, workload=WorkloadConfig(num_prompts=4, random_input_len=16, random_output_len=6),
                      points=(LoadPoint(math.inf, 2),), warmup_requests=0, extra_request_body={"top_p": 0.9})
    (run,) = run_bench(cfg)
    rec = run.record
    for alias, source in VLLM_ALIASES.items():
        assert rec[alias] == rec[source], alias
    assert rec["total_token_throughput"] > 0 and rec["p99_e2el_ms"] > 0
    assert rec["spec_decode_acceptance_length"] == rec["accept_length"] > 1
    assert rec["spec_decode_num_drafts"] == rec["spec_verify_steps"] > 0
    assert rec["sampling"] == {"temperature": 0.0, "ignore_eos": True, "top_p": 0.9}

    import io

    from rich.console import Console

    from specctl.bench.report import render_record

    buf = io.StringIO()
    render_record(Console(file=buf, width=160, markup=False), rec)
    text = buf.getvalue()
    assert "temperature 0.00 (greedy)" in text and "top_p 0.9" in text
    assert "ITL (per token)" in text and "Chunk gap (raw)" in text
