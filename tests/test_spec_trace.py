"""Request-histogram traces: SGLang's per-request acceptance in every spelling, and tune on it.

The fixtures in tests/data/sglang_spec are one request as each SGLang 0.5.23 surface writes it (their
README names the source of each spelling): every one must read as the same request line. The property
test holds the issue's claim: at fixed steps, replaying a trace's histogram form predicts exactly what
replaying its verifies does (min(a, k) summed over a request's verifies is order-free).
"""

from __future__ import annotations

import dataclasses
import json
import math
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from specctl.adaptive.cost import CostModel
from specctl.adaptive.overhead import request_overhead
from specctl.adaptive.replay import Prediction, fixed_config, replay
from specctl.adaptive.search import TuneSetup, tune
from specctl.adaptive.sglang_trace import concurrency, from_meta_info, from_sglext, read_sglang_output
from specctl.adaptive.trace import (
    RequestRecord,
    TraceRecord,
    assumed_order,
    expand_requests,
    histogram_of,
    parse_request,
    read_requests,
    read_trace,
    request_form,
)
from specctl.errors import UsageError
from specctl.schemas.adaptive import AdaptiveConfig, Bucket, Knobs

DATA = Path(__file__).parent / "data" / "sglang_spec"
SURFACES = ("generate.json", "completion.json", "completion_stream.txt", "metrics.log", "log_requests_json.log",
            "log_requests_text.log")
ACCEPTED = (3, 3, 0, 3, 3, 3, 1)  # the fixtures' request, verify by verify


def cost_model(top: int = 7) -> CostModel:
    return CostModel({b: {k: 0.001 * b ** 0.5 * (1 + 0.15 * k) for k in range(top + 1)} for b in (1, 2, 4, 8)})


@pytest.mark.parametrize("name", SURFACES)
def test_every_sglang_surface_reads_as_the_same_request_line(name: str) -> None:
    reqs, verifies, _ = read_sglang_output(DATA / name)
    assert verifies == []
    [line] = reqs
    assert (line.request, line.steps, line.verify_ct, line.histogram) == ("4f0c2a", 3, 7, histogram_of(ACCEPTED))


def test_a_dspark_dump_reads_as_the_verifies_themselves() -> None:
    reqs, verifies, _ = read_sglang_output(DATA / "dspark_server_info.json")
    assert reqs == []
    assert [r.accepted for r in verifies] == [(a,) for a in ACCEPTED]
    assert all(r.drafted == (3,) for r in verifies)  # verify_len counts the bonus position
    # and in the form SGLang's other surfaces give: the same request line
    [line] = request_form(verifies)
    assert (line.steps, line.verify_ct, line.histogram) == (3, 7, histogram_of(ACCEPTED))


def test_launch_steps_come_from_sglangs_proposed_drafts() -> None:
    meta = json.loads((DATA / "generate.json").read_text())["meta_info"]
    assert from_meta_info(meta).launch_steps == 3  # type: ignore[union-attr]
    # without spec_num_proposed_drafts only the largest accepted count bounds it, unless --steps says
    del meta["spec_num_proposed_drafts"]
    meta["spec_correct_drafts_histogram"] = [1, 1]
    meta["spec_verify_ct"] = 2
    assert from_meta_info(meta).launch_steps is None  # type: ignore[union-attr]


def test_n_choices_each_give_a_request() -> None:
    body = json.loads((DATA / "completion.json").read_text())
    one = body["sglext"]["spec_tokens_details"]
    body["sglext"]["spec_tokens_details"] = [one, {**one, "spec_correct_drafts_histogram": [2], "spec_verify_ct": 2}]
    assert [s.histogram for s in from_sglext(body)] == [histogram_of(ACCEPTED), (2,)]


def test_concurrency_is_the_mean_overlap_of_decode_spans() -> None:
    # two requests side by side, then one alone for as long
    assert concurrency([(0.0, 1.0), (0.0, 2.0), None]) == [2, 2, None]
    assert concurrency([(0.0, 1.0), (5.0, 6.0)]) == [1, 1]


@pytest.mark.parametrize(("obj", "field"), [
    ({"request": "a", "steps": 3, "spec_verify_ct": 3, "spec_correct_drafts_histogram": [1, 1]}, "spec_verify_ct"),
    ({"request": "a", "steps": 1, "spec_verify_ct": 1, "spec_correct_drafts_histogram": [0, 0, 1]}, "more than steps"),
    ({"request": "a", "spec_verify_ct": 1, "spec_correct_drafts_histogram": [1]}, "steps"),
    ({"request": "a", "steps": 3, "spec_verify_ct": 1, "spec_correct_drafts_histogram": [-1]}, "histogram"),
    ({"request": "a", "steps": 3, "spec_verify_ct": 2, "spec_correct_drafts_histogram": [1, 1], "accepted": [1, 1]},
     "accepted"),
    ({"request": "a", "steps": 3, "spec_verify_ct": 1, "spec_correct_drafts_histogram": [1], "batch_size": 0},
     "batch_size"),
])
def test_a_bad_request_line_names_its_field(obj: dict, field: str) -> None:
    with pytest.raises(UsageError, match=field):
        parse_request(obj, "t.jsonl", 4)


def test_a_file_without_statistics_says_where_they_come_from(tmp_path: Path) -> None:
    f = tmp_path / "server.log"
    f.write_text("[2026-12-08] INFO: nothing here\n")
    with pytest.raises(UsageError, match="no request with speculative statistics") as err:
        read_sglang_output(f)
    assert "--export-metrics-to-file" in (err.value.hint or "")


def test_assumed_order_spreads_each_count_over_the_request() -> None:
    order = assumed_order((2, 0, 0, 6))
    assert sorted(order) == [0, 0, 3, 3, 3, 3, 3, 3]
    assert order.index(0) > 0 and order[-1] == 3 and order.count(0) == 2 and order[0] == 3


# ---- fixed steps: the histogram form predicts exactly what the verifies do ----------------------------------

@st.composite
def grouped_traces(draw: st.DrawFn) -> tuple[list[TraceRecord], list[RequestRecord], int]:
    """Verify records (with rids) of requests that each decode at one batch size (lockstep groups), and the same
    run's request lines."""
    depth = draw(st.integers(1, 5))
    verifies: list[TraceRecord] = []
    requests: list[RequestRecord] = []
    for g in range(draw(st.integers(1, 3))):
        width = draw(st.sampled_from((1, 2, 4)))
        n = draw(st.integers(1, 12))
        rows = [tuple(draw(st.integers(0, depth)) for _ in range(width)) for _ in range(n)]
        rids = tuple(len(requests) + j for j in range(width))
        verifies += [TraceRecord(line=0, batch_size=width, accepted=row, steps=depth, trace_steps=depth, rids=rids,
                                 run="r") for row in rows]
        for j in range(width):
            col = [row[j] for row in rows]
            requests.append(RequestRecord(0, f"{g}/{j}", depth, n, histogram_of(col), width, None, "r"))
    return verifies, requests, depth


def same_prediction(a: Prediction, b: Prediction) -> None:
    assert math.isclose(a.tokens_per_s, b.tokens_per_s, rel_tol=1e-9)
    assert a.by_batch.keys() == b.by_batch.keys()
    for size, (tok, sec, w) in a.by_batch.items():
        t2, s2, w2 = b.by_batch[size]
        assert (tok, w) == (t2, w2) and math.isclose(sec, s2, rel_tol=1e-9)


@given(grouped_traces())
def test_histogram_replay_equals_per_verify_replay_at_fixed_steps(
        case: tuple[list[TraceRecord], list[RequestRecord], int]) -> None:
    """Verify for verify (min(a, k) per traced verify): exact whatever the order."""
    verifies, requests, depth = case
    plain = [dataclasses.replace(r, rids=None) for r in verifies]
    expanded = [dataclasses.replace(r, rids=None) for r in expand_requests(requests)]
    cost = cost_model()
    for k in range(depth + 1):
        same_prediction(replay(fixed_config(k), plain, cost, initial_steps=k),
                        replay(fixed_config(k), expanded, cost, initial_steps=k))


def test_tune_reads_request_lines_bounded_by_their_launch_steps(tmp_path: Path) -> None:
    trace = tmp_path / "t.jsonl"
    lines = [RequestRecord(0, f"r{i}", 3, 24, (2, 2, 4, 16), 2, None, "run").to_json() for i in range(8)]
    trace.write_text("".join(json.dumps(x) + "\n" for x in lines))
    records = read_trace(trace)
    assert records and all(r.from_requests and r.trace_steps == 3 for r in records)
    cfg = AdaptiveConfig((Bucket(1, (1, 3), Knobs()),))
    result = tune(TuneSetup(cfg, 1), records, cost_model(7))
    assert max(result.allowed_steps) == 3 and max(result.recommended.union_steps) <= 3
    assert any("recorded at steps 3" in n and "5, 6, 7" in n for n in result.notes)
    assert any("histograms" in n and "assume an order" in n for n in result.notes)
    assert result.cost_model == "of unknown origin (no `adaptive profile` metadata)" and not result.cost_estimated


def test_tune_says_which_cost_model_priced_it() -> None:
    measured = CostModel(cost_model().step_s, {"deployment": "tiny-pd", "device": "cpu", "threads": 1,
                                               "clock": "cpu", "created": "2026-12-08T00:00:00Z"})
    assert measured.provenance() == ("measured by `adaptive profile` of tiny-pd on cpu (1 thread(s), cpu clock, "
                                     "2026-12-08T00:00:00Z)")
    served = CostModel(cost_model().step_s, {"source": "served", "deployment": "http://127.0.0.1:30000",
                                             "clock": "wall", "created": "2026-12-08T00:00:00Z"})
    assert served.provenance() == ("measured by `adaptive profile` on the running server http://127.0.0.1:30000 "
                                   "(served steps, timed per request, wall clock, 2026-12-08T00:00:00Z)")
    guessed = CostModel(cost_model().step_s, {"estimate": "aiconfigurator's database, H100 SXM, fp8"})
    assert guessed.estimate is not None
    assert guessed.provenance().startswith("an ESTIMATE, not a measurement: aiconfigurator")


def test_time_to_first_token_is_the_serving_overhead_of_request_lines(tmp_path: Path) -> None:
    lines = [RequestRecord(0, f"r{i}", 3, 24, (2, 2, 4, 16), 2, None, "run", decode_s=0.5, ttft_s=0.03)
             for i in range(8)]
    trace = tmp_path / "t.jsonl"
    trace.write_text("".join(json.dumps(x.to_json()) + "\n" for x in lines))
    records, requests = read_trace(trace), read_requests(trace)
    assert requests == [dataclasses.replace(x, line=i + 1) for i, x in enumerate(lines)]
    cost = cost_model(3)
    work = sum(r.tokens for r in requests)
    ovh = request_overhead(requests, records, cost, fixed_config(3), 3)
    assert ovh is not None and ovh.source == "requests"
    assert math.isclose(ovh.per_token, 8 * 0.03 / 2 / work)
    result = tune(TuneSetup(AdaptiveConfig((Bucket(1, (1, 3), Knobs()),)), 1), records, cost, requests=requests)
    assert result.overhead == ovh and result.none.overhead_s_per_token == ovh.per_token
    # a request without its time to first token: no estimate (decode only), never a guess
    assert request_overhead([*requests, dataclasses.replace(requests[0], ttft_s=None)], records, cost,
                            fixed_config(3), 3) is None


def test_request_lines_never_share_a_run_with_an_unnamed_engine_trace(tmp_path: Path) -> None:
    trace = tmp_path / "t.jsonl"
    trace.write_text(json.dumps({"batch_size": 1, "accepted": [2], "steps": 3, "rids": [0]}) + "\n"
                     + json.dumps(RequestRecord(0, "a", 3, 2, (0, 1, 1), 1).to_json()) + "\n")
    records = read_trace(trace)
    assert [(r.run, r.rids, r.from_requests) for r in records] == [
        (None, (0,), False), ("requests", (0,), True), ("requests", (0,), True)]
