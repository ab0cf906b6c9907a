"""`specctl watch` against SGLang 0.5.23's HTTP shapes (tests/sglang_http/, written from SGLang's source),
served by real aiohttp servers on 127.0.0.1: the `sglang:` metrics read, each alert named at the tick that
sees its cause, and the --once exit codes."""

from __future__ import annotations

import itertools
import os
from collections.abc import Iterator
from typing import Any

import pytest
from sglang_fixture_server import SGLANG_DATA, FixtureServer, fixture, json_answer, text_answer
from typer.testing import CliRunner

from specctl.cli.main import app
from specctl.preflight.watch import Watch, read_role

os.environ["HF_HUB_OFFLINE"] = "1"
os.environ["TRANSFORMERS_OFFLINE"] = "1"

METRICS = (SGLANG_DATA / "metrics_decode_after.txt").read_text()


def prefill_metrics(inflight: int, mb: float, failed: int = 0) -> str:
    labels = '{engine_type="prefill",model_name="m",tp_rank="0"}'
    return (f"# TYPE sglang:num_running_reqs gauge\nsglang:num_running_reqs{labels} 0.0\n"
            f"# TYPE sglang:num_queue_reqs gauge\nsglang:num_queue_reqs{labels} 0.0\n"
            f"# TYPE sglang:num_prefill_inflight_queue_reqs gauge\n"
            f"sglang:num_prefill_inflight_queue_reqs{labels} {inflight}.0\n"
            f"# TYPE sglang:kv_transfer_total_mb gauge\nsglang:kv_transfer_total_mb{labels} {mb}\n"
            f"# TYPE sglang:num_transfer_failed_reqs_total counter\n"
            f"sglang:num_transfer_failed_reqs_total{labels} {failed}.0\n")


class Pair:
    """SGLang-shaped prefill (with its bootstrap) and decode; each path's answers are given in order."""

    def __init__(self, prefill_metrics_seq: list[str], decode_infos: list[dict[str, Any]] | None = None) -> None:
        self.bootstrap = FixtureServer({"/route": [json_answer(fixture("route_prefill.json"))]})
        p_info = {**fixture("server_info_prefill.json"), "disaggregation_bootstrap_port": self.bootstrap.port}
        self.prefill = FixtureServer({"/server_info": [json_answer(p_info)],
                                      "/model_info": [json_answer(fixture("model_info_prefill.json"))],
                                      "/metrics": [text_answer(t) for t in prefill_metrics_seq]})
        infos = decode_infos or [fixture("server_info_decode.json")]
        self.decode = FixtureServer({"/server_info": [json_answer(i) for i in infos],
                                     "/model_info": [json_answer(fixture("model_info_decode.json"))],
                                     "/metrics": [text_answer(METRICS)],
                                     "/get_load": [json_answer([{"dp_rank": 0, "num_reqs": 15,
                                                                 "num_waiting_reqs": 3, "num_tokens": 900}])]})

    def watch(self, **kw: Any) -> Watch:
        ticks = itertools.count(0.0, 1.0)
        return Watch(self.prefill.url, self.decode.url, stall_after_s=1.0, clock=lambda: next(ticks), **kw)

    def close(self) -> None:
        for s in (self.prefill, self.decode, self.bootstrap):
            s.close()


@pytest.fixture
def pair_of() -> Iterator[Any]:
    made: list[Pair] = []

    def make(*a: Any, **kw: Any) -> Pair:
        made.append(Pair(*a, **kw))
        return made[-1]

    yield make
    for p in made:
        p.close()


def test_sglang_metrics_are_read_by_their_names(pair_of: Any) -> None:
    pair = pair_of([prefill_metrics(0, 10.0)])
    dec = read_role("decode", pair.decode.url)
    assert (dec.family, dec.running, dec.waiting, dec.accept_length_gauge, dec.tier) == (
        "sglang", 12.0, 3.0, 2.8125, {"": 3.0})
    pre = read_role("prefill", pair.prefill.url)
    assert (pre.in_transfer, pre.transfer_bytes, pre.transfer_errors) == (0.0, 10.0e6, 0.0)


def test_a_matched_idle_pair_raises_no_alert(pair_of: Any) -> None:
    w = pair_of([prefill_metrics(0, 10.0)]).watch()
    ticks = [w.tick(), w.tick()]
    assert [t.alerts for t in ticks] == [(), ()]
    assert ticks[1].preflight is not None and ticks[1].preflight["ok"]
    assert ticks[1].pd_load_ratio == 0.0 and ticks[1].accept_length == 2.8125


def test_a_transfer_that_stops_moving_while_requests_wait_is_a_stall(pair_of: Any) -> None:
    w = pair_of([prefill_metrics(2, 10.0), prefill_metrics(2, 20.0), prefill_metrics(2, 20.0)]).watch()
    first, moving, stalled = w.tick(), w.tick(), w.tick()
    assert not first.alerts and not moving.alerts and moving.transfer_bytes_per_s == 10.0e6
    assert [a.name for a in stalled.alerts] == ["transfer_stall"]
    assert stalled.since_transfer_s == 1.0


def test_transfer_errors_are_named(pair_of: Any) -> None:
    w = pair_of([prefill_metrics(0, 10.0), prefill_metrics(0, 10.0, failed=2)]).watch()
    w.tick()
    assert [(a.name, a.message) for a in w.tick().alerts] == [
        ("transfer_errors", "2 transfer error(s) since the last tick")]


def test_a_decode_back_with_another_page_size_is_named_at_once(pair_of: Any) -> None:
    good = fixture("server_info_decode.json")
    w = pair_of([prefill_metrics(0, 10.0)], [good, {**good, "page_size": good["page_size"] * 2}]).watch()
    assert not w.tick().alerts
    names = {(a.name, a.role) for a in w.tick().alerts}
    assert names == {("pair_mismatch", "pair"), ("server_changed", "decode")}


def test_once_exit_codes(pair_of: Any) -> None:
    runner = CliRunner()
    clean = pair_of([prefill_metrics(0, 10.0)])
    args = ["watch", "--prefill", clean.prefill.url, "--decode", clean.decode.url, "--once", "--interval", "0.2",
            "--format", "json"]
    res = runner.invoke(app, args)
    assert res.exit_code == 0, res.output
    stalled = pair_of([prefill_metrics(1, 5.0)])
    res = runner.invoke(app, ["watch", "--prefill", stalled.prefill.url, "--decode", stalled.decode.url, "--once",
                              "--interval", "0.3", "--stall-after", "0.2", "--format", "json"])
    assert res.exit_code == 1 and "transfer_stall" in res.output, res.output
    url = clean.decode.url
    clean.decode.close()
    res = runner.invoke(app, ["watch", "--prefill", clean.prefill.url, "--decode", url, "--once", "--interval",
                              "0.2"])
    assert res.exit_code == 3 and "server_unreachable" in res.output, res.output
    res = runner.invoke(app, ["watch", "--prefill", "ftp://x", "--decode", url, "--once"])
    assert res.exit_code == 2 and "--prefill must be an http" in res.output


def specctl_decode_metrics(verifies: int, accepted: int, steps: int) -> str:
    return ("# TYPE specctl_requests_running gauge\nspecctl_requests_running{model_name=\"m\"} 4\n"
            "# TYPE specctl_spec_verify_steps_total counter\n"
            f"specctl_spec_verify_steps_total{{model_name=\"m\"}} {verifies}\n"
            "# TYPE specctl_spec_accepted_tokens_total counter\n"
            f"specctl_spec_accepted_tokens_total{{model_name=\"m\"}} {accepted}\n"
            "# TYPE specctl_adaptive_steps gauge\n"
            f"specctl_adaptive_steps{{model_name=\"m\",bucket=\"1\"}} {steps}\n")


def test_acceptance_that_collapses_is_named_beside_the_tier_the_config_expects(pair_of: Any) -> None:
    from specctl.preflight.watch import policy_tier

    pair = pair_of([prefill_metrics(0, 10.0)])
    decode = FixtureServer({"/metrics": [text_answer(specctl_decode_metrics(*m)) for m in
                                         ((0, 0, 3), (100, 300, 3), (200, 320, 3))],
                            "/server_info": [json_answer(fixture("server_info_decode.json"))],
                            "/model_info": [json_answer(fixture("model_info_decode.json"))]})
    try:
        tiers = policy_tier({"buckets": {1: {"candidate_steps": [1, 3, 5]}}}, 3)
        assert tiers is not None and tiers(4.8, 4) == 5 and tiers(0.1, 4) == 1
        ticks = itertools.count(0.0, 1.0)
        w = Watch(pair.prefill.url, decode.url, stall_after_s=1.0, clock=lambda: next(ticks), tier_model=tiers)
        first, good, bad = w.tick(), w.tick(), w.tick()
        assert first.accept_length is None and good.accept_length == 4.0 and good.tier == {"1": 3.0}
        assert good.expected_tier == 5 and not good.alerts
        assert bad.accept_length == 1.2 and bad.expected_tier == 1
        assert [a.name for a in bad.alerts] == ["acceptance_collapse"]
    finally:
        decode.close()
