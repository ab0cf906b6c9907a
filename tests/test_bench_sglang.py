"""Bench reads SGLang: `/server_info` `internal_states[].avg_spec_accept_length`, `sglang:` Prometheus
gauges and counters (fixtures written from SGLang 0.5.23's code), and binds the preflight of a pair.

The end-to-end cases run `specctl bench --url` against the bench's real stub HTTP server whose
`/server_info` and `/metrics` answer SGLang's shapes, on 127.0.0.1.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from typing import Any

import pytest
from aiohttp import web
from sglang_fixture_server import SGLANG_DATA, FixtureServer, fixture, json_answer
from typer.testing import CliRunner

from specctl.bench.stub_server import StubBehaviour, StubServer
from specctl.cli.main import app
from specctl.schemas import server_info as si
from specctl.schemas.prometheus import metrics_delta, sglang_metrics, spec_accept_length

os.environ["HF_HUB_OFFLINE"] = "1"
os.environ["TRANSFORMERS_OFFLINE"] = "1"

runner = CliRunner()
BEFORE = (SGLANG_DATA / "metrics_decode_before.txt").read_text()
AFTER = (SGLANG_DATA / "metrics_decode_after.txt").read_text()
LABELS = 'engine_type="decode",model_name="/models/Qwen3-Next-80B-A3B-Instruct"'


def test_server_accept_length_is_the_mean_over_dp_ranks() -> None:
    info = fixture("server_info_decode.json")
    assert si.server_accept_length(info) == pytest.approx(2.8125)
    rank = info["internal_states"][0]
    info["internal_states"] = [rank, {**rank, "avg_spec_accept_length": 3.1875}, {"no": "speculation"}]
    assert si.server_accept_length(info) == pytest.approx(3.0)
    assert si.server_accept_length(fixture("server_info_prefill.json")) is None  # prefill does not verify


def test_sglang_gauges_combine_over_ranks() -> None:
    got = sglang_metrics(AFTER)
    assert got is not None
    assert got["num_running_reqs"] == 12.0 and got["num_queue_reqs"] == 3.0
    assert got["spec_accept_length"] == pytest.approx(2.8125) and got["spec_accept_rate"] == pytest.approx(0.604)
    assert got["gen_throughput"] == pytest.approx(1834.2)
    # A second TP rank: counts add up, ratios average.
    rank1 = "\n".join(line.replace('tp_rank="0"', 'tp_rank="1"') for line in AFTER.splitlines()
                      if line.startswith(("sglang:num_running_reqs", "sglang:spec_accept_length")))
    two = sglang_metrics(AFTER + rank1.replace("} 12.0", "} 4.0").replace("} 2.8125", "} 2.1875") + "\n")
    assert two is not None
    assert two["num_running_reqs"] == 16.0 and two["spec_accept_length"] == pytest.approx(2.5)
    assert sglang_metrics("# TYPE stub_requests_total counter\nstub_requests_total 3\n") is None
    assert spec_accept_length(AFTER) == pytest.approx(2.8125) and spec_accept_length(None) is None


def test_sglang_counters_and_histograms_diff_between_scrapes() -> None:
    delta = metrics_delta(BEFORE, AFTER)
    assert delta is not None
    c = delta["counters"]
    assert c[f'sglang:generation_tokens_total{{{LABELS},is_streaming="true"}}'] == 16384.0
    assert c[f"sglang:num_requests_total{{{LABELS}}}"] == 32.0
    assert c[f'sglang:time_to_first_token_seconds_count{{{LABELS},is_streaming="true"}}'] == 32.0
    assert delta["gauges"][f'sglang:num_running_reqs{{{LABELS},moe_ep_rank="0",pp_rank="0",tp_rank="0"}}'] == 12.0


class SGLangStub(StubServer):
    """The bench's stub server answering SGLang's /server_info and /metrics (before, then after)."""

    def __init__(self, *, server_info: bool = True) -> None:
        self.sglang_info = server_info
        self.scrapes = 0
        super().__init__(StubBehaviour(accept_pattern=(), default_max_tokens=6))

    async def _server_info(self, request: web.Request) -> web.Response:
        if not self.sglang_info:
            return web.Response(status=404, text="Not Found")
        return web.json_response(fixture("server_info_decode.json"))

    async def _metrics(self, request: web.Request) -> web.Response:
        self.scrapes += 1
        return web.Response(text=BEFORE if self.scrapes == 1 else AFTER, content_type="text/plain")


def _bench(url: str, *args: str) -> Any:
    res = runner.invoke(app, ["bench", "--url", url, "--num-prompts", "4", "--random-input-len", "8",
                              "--random-output-len", "4", "--no-progress", "--format", "json", *args])
    return res


def test_bench_reads_acceptance_and_gauges_from_an_sglang_server() -> None:
    with SGLangStub() as stub:
        res = _bench(stub.url)
    assert res.exit_code == 0, res.output
    (rec,) = [json.loads(line) for line in res.stdout.splitlines()]  # JSON Lines, one record per point
    assert rec["accept_length"] == pytest.approx(2.8125) and rec["accept_length_source"] == "server_info"
    assert rec["sglang_metrics"]["num_running_reqs"] == 12.0
    assert rec["server_metrics"]["counters"][f"sglang:num_requests_total{{{LABELS}}}"] == 32.0
    assert rec["preflight"] is None


def test_bench_falls_back_to_the_accept_length_gauge() -> None:
    with SGLangStub(server_info=False) as stub:
        res = _bench(stub.url)
    assert res.exit_code == 0, res.output
    (rec,) = [json.loads(line) for line in res.stdout.splitlines()]  # JSON Lines, one record per point
    assert rec["accept_length"] == pytest.approx(2.8125) and rec["accept_length_source"] == "metrics"


@pytest.fixture
def sglang_pair() -> Iterator[Any]:
    servers: list[FixtureServer] = []

    def make(decode: dict[str, Any] | None = None) -> tuple[str, str]:
        boot = FixtureServer({"/route": [json_answer(fixture("route_prefill.json"))]})
        p = FixtureServer({"/server_info": [json_answer({**fixture("server_info_prefill.json"),
                                                         "disaggregation_bootstrap_port": boot.port})]})
        d = FixtureServer({"/server_info": [json_answer({**fixture("server_info_decode.json"), **(decode or {})})]})
        servers.extend((boot, p, d))
        return p.url, d.url

    yield make
    for s in servers:
        s.close()


def test_bench_record_binds_the_preflight_fingerprints_of_both_roles(sglang_pair: Any) -> None:
    p, d = sglang_pair()
    with SGLangStub() as stub:
        res = _bench(stub.url, "--preflight", p, d)
    assert res.exit_code == 0, res.output
    (rec,) = [json.loads(line) for line in res.stdout.splitlines()]  # JSON Lines, one record per point
    pre = rec["preflight"]
    assert pre["ok"] is True and pre["prefill"] == pre["decode"] and len(pre["prefill"]) == 16


def test_bench_refuses_a_mismatched_pair_before_sending_load(sglang_pair: Any) -> None:
    p, d = sglang_pair(decode={"page_size": 32})
    with SGLangStub() as stub:
        res = _bench(stub.url, "--preflight", p, d)
        assert stub.scrapes == 0  # no load, no snapshot
    assert res.exit_code == 3
    assert "page_size" in " ".join(res.output.split()) and "Traceback" not in res.output


def test_probe_reads_unusable_json_as_n_a_never_a_crash() -> None:
    import asyncio

    import aiohttp
    from sglang_fixture_server import text_answer

    from specctl.bench.probe import ServerProbe

    deep = text_answer("[" * 200_000, content_type="application/json")  # json.loads: RecursionError
    with FixtureServer({"/server_info": [deep], "/get_server_info": [text_answer("not json")],
                        "/v1/models": [json_answer({"data": [{"id": "m"}]})]}) as server:
        async def probe() -> tuple[Any, Any]:
            async with aiohttp.ClientSession() as session:
                p = ServerProbe(session, server.url, timeout_s=5)
                return await p.server_info(), await p.get_json("/v1/models")

        info, models = asyncio.run(probe())
    assert info is None and models == {"data": [{"id": "m"}]}
