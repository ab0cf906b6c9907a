"""Metric arithmetic of the bench client on hand-built results (oracles computed independently)."""

from __future__ import annotations

import numpy as np
import pytest

from specctl.bench.acceptance import request_acceptance, summarize_acceptance
from specctl.bench.compare import compare_records
from specctl.bench.config import LoadPoint
from specctl.bench.load import LoadResult
from specctl.bench.metrics import stats_ms, summarize_load
from specctl.bench.request import RequestResult
from specctl.schemas.prometheus import metrics_delta, parse_metrics
from specctl.schemas.server_info import (
    adaptive_state,
    adaptive_switches,
    batches_per_steps,
    fingerprint,
    server_accept_length,
    time_per_step,
)


def _ok(index: int, scheduled: float, first: float, gaps: list[float], *, usage=None, timings=None) -> RequestResult:
    r = RequestResult(index=index, prompt_len=10, output_len=len(gaps) + 1, scheduled=scheduled, sent=scheduled)
    t = first
    r.first_token = t
    r.chunk_times = [t]
    for g in gaps:
        t += g
        r.chunk_times.append(t)
    r.end = t
    r.usage = usage
    r.timings = timings
    r.finish_reason = "length"
    return r


def test_stats_ms_matches_numpy() -> None:
    vals = [0.010, 0.020, 0.030, 0.040, 0.500]
    s = stats_ms(vals)
    a = np.array(vals) * 1000
    assert s["mean"] == pytest.approx(a.mean())
    assert s["median"] == pytest.approx(30.0)
    assert s["p99"] == pytest.approx(np.percentile(a, 99))
    assert s["max"] == pytest.approx(500.0)
    assert s["std"] == pytest.approx(a.std())
    assert stats_ms([]) == dict.fromkeys(s)


def test_summarize_load_latencies_goodput_and_errors() -> None:
    # Request 0: scheduled 0, first token at 0.1, 3 more tokens 0.02 apart -> e2e 0.16, tpot 0.02.
    r0 = _ok(0, 0.0, 0.1, [0.02, 0.02, 0.02])
    # Request 1: scheduled 1.0 but sent late (client-side wait counts): first token 1.5, e2e 0.9, tpot 0.2.
    r1 = _ok(1, 1.0, 1.5, [0.2, 0.2])
    r1.sent = 1.3
    # Server-reported counts win over chunk counts.
    r1.usage = {"prompt_tokens": 33, "completion_tokens": 5}
    bad = RequestResult(index=2, prompt_len=10, output_len=4, scheduled=2.0, sent=2.0)
    bad.fail("http_500", "boom")
    bad2 = RequestResult(index=3, prompt_len=10, output_len=4, scheduled=3.0, sent=3.0)
    bad2.fail("timeout", "slow")
    load = LoadResult(LoadPoint(1.0), [r0, r1, bad, bad2], start=0.0, wall_start=0.0, mono_start=0.0, end=2.0)
    s = summarize_load(load, {"ttft": 0.2, "tpot": 0.05})
    assert s["completed"] == 2 and s["failed"] == 2
    assert s["errors"] == {"http_500": 1, "timeout": 1}
    assert s["error_examples"]["http_500"] == "boom"
    assert s["mean_ttft_ms"] == pytest.approx((100 + 500) / 2)
    assert s["max_e2e_latency_ms"] == pytest.approx(900.0)
    # r1's TPOT uses usage.completion_tokens=5: (0.4) / 4 = 0.1.
    assert s["median_tpot_ms"] == pytest.approx((20 + 100) / 2)
    assert s["mean_itl_ms"] == pytest.approx(np.mean([20, 20, 20, 200, 200]))
    assert s["total_input_tokens"] == 10 + 33 and s["total_output_tokens"] == 4 + 5
    assert s["request_throughput"] == pytest.approx(2 / 2.0)
    assert s["max_send_delay_ms"] == pytest.approx(300.0)
    # Only r0 meets both SLOs.
    assert s["goodput"] == pytest.approx(1 / 2.0) and s["goodput_fraction"] == pytest.approx(0.25)
    assert s["ttft_breakdown"] is None


def test_ttft_breakdown_from_server_timings() -> None:
    rs = [_ok(i, 0.0, 0.050, [0.01], timings={"prefill_ms": 20.0, "transfer_s": 0.005, "decode_queue_ms": 5.0,
                                               "decode_ms": 99.0})
          for i in range(3)]
    s = summarize_load(LoadResult(LoadPoint(), rs, 0.0, 0.0, 0.0, 1.0), {})
    b = s["ttft_breakdown"]
    assert b["prefill_ms"]["mean"] == pytest.approx(20.0)
    assert b["transfer_ms"]["median"] == pytest.approx(5.0)
    # 50 ms TTFT - (20 + 5 + 5) attributed = 20 ms; decode_ms is not a TTFT phase.
    assert b["unattributed_ms"]["mean"] == pytest.approx(20.0)
    assert b["decode_ms"]["mean"] == pytest.approx(99.0)


def test_acceptance_is_read_from_whatever_usage_carries() -> None:
    assert request_acceptance({"accept_lengths": [2, 0, 3]}) == (5, 3, [2, 0, 3])
    assert request_acceptance({"spec_accepted_tokens": 6, "spec_verify_steps": 4}) == (6, 4, None)
    assert request_acceptance({"spec_accepted_tokens": 6, "spec_verify_ct": 3}) == (6, 3, None)
    assert request_acceptance({"completion_tokens": 5}) is None
    assert request_acceptance(None) is None
    rs = [_ok(0, 0, 0.1, [0.1], usage={"accept_lengths": [2, 0, 3, 3]}),
          _ok(1, 0, 0.1, [0.1], usage={"spec_accepted_tokens": 2, "spec_verify_steps": 4}),
          _ok(2, 0, 0.1, [0.1], usage={"completion_tokens": 2})]
    s = summarize_acceptance(rs, server_accept_length=9.0)
    assert s["accept_length"] == pytest.approx(1 + (8 + 2) / (4 + 4))
    assert s["accept_length_source"] == "usage"
    assert s["accepted_per_step_histogram"] == {"0": 1, "2": 1, "3": 2}
    assert s["accept_length_per_request"]["requests"] == 2
    fallback = summarize_acceptance([rs[2]], server_accept_length=2.5)
    assert (fallback["accept_length"], fallback["accept_length_source"]) == (2.5, "server_info")
    none = summarize_acceptance([rs[2]], server_accept_length=None)
    assert none["accept_length"] is None and none["accept_length_source"] is None


def test_prometheus_parse_and_delta() -> None:
    before = "# TYPE req counter\nreq_total 5\nlat_bucket{le=\"0.1\"} 3\nrunning 2\n"
    after = ("# HELP req total\n# TYPE req counter\nreq_total 12\nlat_bucket{le=\"0.1\"} 3\n"
             "lat_bucket{le=\"1\"} 4\nrunning 7\ngarbage line here !!\nnan_gauge NaN\n")
    samples, types = parse_metrics(after)
    assert samples["req_total"] == 12 and types["req"] == "counter"
    d = metrics_delta(before, after)
    assert d["counters"] == {"req_total": 7.0, 'lat_bucket{le="1"}': 4.0}
    assert d["gauges"] == {"running": 7.0}
    assert metrics_delta(before, None) is None


def test_server_info_readers_are_tolerant() -> None:
    before = {"speculative": {"adaptive": {"switches": [{"time": 1.0, "bucket": "1", "from_steps": 3, "to_steps": 5,
                                                         "ema": 3.1}]}}}
    after = {"decode": [{"fingerprint": "abc123", "avg_spec_accept_length": 2.75,
                         "speculative": {"time_per_step_ms": {"3": 12.5, "bad": "x"},
                                         "adaptive": {"switches": [
                                             {"time": 1.0, "bucket": "1", "from_steps": 3, "to_steps": 5, "ema": 3.1},
                                             [2.0, "1", 5, 3, 1.9]]}}}]}
    assert fingerprint(after) == "abc123"
    assert server_accept_length(after) == 2.75
    assert time_per_step(after) == {"3": 12.5}
    assert adaptive_switches(before, after) == [{"time": 2.0, "bucket": "1", "from_steps": 5, "to_steps": 3,
                                                 "ema": 1.9}]
    for reader in (fingerprint, server_accept_length, time_per_step):
        assert reader(None) is None and reader({"other": [1, 2]}) is None
    assert adaptive_switches(None, {"x": 1}) is None
    # specctl's own shape: per-role fingerprints and the mean step time in seconds.
    ours = {"roles": {"decode": {"server_info": {"fingerprints": {"target": "t1", "draft": {"hash": "d2"}},
                                                 "timing": {"mean_step_s": 0.0125}}}}}
    assert fingerprint(ours) == "draft.hash=d2,target=t1"
    assert time_per_step(ours) == pytest.approx(12.5)
    # A deployment echo's `adaptive` (configuration) is not the live state; the live one is found.
    live = {"deployment": {"raw": {"speculative": {"adaptive": {"strategy": "ema"}}}},
            "roles": {"decode": {"server_info": {
                "adaptive": {"switches": [], "batches_per_steps": {"3": 10, "5": 2}}}}}}
    assert adaptive_state(live) == {"switches": [], "batches_per_steps": {"3": 10, "5": 2}}
    before = {"adaptive": {"batches_per_steps": {"3": 4}}}
    assert batches_per_steps(before, live) == {"3": 6, "5": 2}
    assert batches_per_steps(before, {"x": 1}) is None


def test_compare_records_direction() -> None:
    a = {"request_throughput": 10.0, "p99_ttft_ms": 100.0, "accept_length": 2.0, "failed": 0}
    b = {"request_throughput": 12.0, "p99_ttft_ms": 150.0, "accept_length": None, "failed": 0}
    rows = {r.field: r for r in compare_records(a, b)}
    assert rows["request_throughput"].verdict == "better" and rows["request_throughput"].pct == pytest.approx(20.0)
    assert rows["p99_ttft_ms"].verdict == "worse" and rows["p99_ttft_ms"].delta == pytest.approx(50.0)
    assert rows["accept_length"].delta is None and rows["failed"].verdict == "same"
