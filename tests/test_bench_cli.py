"""`specctl bench` and `specctl bench compare` end to end through the CLI against a real stub server."""

from __future__ import annotations

import json
import statistics
import struct
from collections.abc import Iterator
from pathlib import Path

import pytest
from typer.testing import CliRunner

from specctl.bench.record import REQUIRED_FIELDS
from specctl.bench.stub_server import StubBehaviour, StubServer
from specctl.cli.main import app

runner = CliRunner()


@pytest.fixture(scope="module")
def stub() -> Iterator[StubServer]:
    with StubServer(StubBehaviour(ttft_s=0.005, itl_s=0.002, timings={"prefill_ms": 1.0, "transfer_ms": 0.5},
                                  switch_every=4)) as s:
        yield s


def _bench(url: str, *args: str) -> object:
    return runner.invoke(app, ["bench", "--url", url, "--num-prompts", "12", "--random-input-len", "16",
                               "--random-output-len", "6", "--no-progress", *args])


def _png_size(path: Path) -> tuple[int, int]:
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    assert data[12:16] == b"IHDR"
    return struct.unpack(">II", data[16:24])


def test_json_output_jsonl_record_and_plot(stub: StubServer, tmp_path: Path) -> None:
    stub.reset()
    out, png = tmp_path / "runs" / "a.jsonl", tmp_path / "a.png"
    res = _bench(stub.url, "--request-rate", "60", "--slo", "ttft=0.5,tpot=0.05", "--format", "json",
                 "--output", str(out), "--plot", str(png), "--tag", "first")
    assert res.exit_code == 0, res.output
    (line,) = res.stdout.splitlines()  # JSON Lines: one record per sweep point, as --output appends
    rec = json.loads(line)
    assert rec == json.loads(out.read_text().splitlines()[-1])  # one record shape for both
    missing = [f for f in REQUIRED_FIELDS if f not in rec]
    assert not missing
    assert rec["completed"] == 12 and rec["request_rate"] == 60.0 and rec["tag"] == "first"
    assert rec["model"] == "stub-model"  # from /v1/models
    assert rec["fingerprint"] == "stub-fingerprint-0001"
    assert rec["goodput_fraction"] == 1.0
    assert rec["ttft_breakdown"]["prefill_ms"]["mean"] == pytest.approx(1.0)
    assert rec["server_metrics"]["counters"]["stub_requests_total"] >= 12
    # A switch at arrivals 0 (the warm-up: before the run), 4, 8, 12: the run's three, on its own time axis.
    switches = rec["adaptive"]["switches"]
    assert len(switches) == 3 and [s["to_steps"] for s in switches] == [1, 3, 5]
    assert all(-0.1 <= s["t_rel_s"] <= rec["duration"] + 0.1 for s in switches)
    assert rec["adaptive"]["time_per_step_ms"]
    assert rec["config"]["workload"]["num_prompts"] == 12
    lines = out.read_text().splitlines()
    assert len(lines) == 1 and json.loads(lines[0])["mean_ttft_ms"] == pytest.approx(rec["mean_ttft_ms"])
    width, height = _png_size(png)
    assert width >= 800 and height >= 600 and png.stat().st_size > 20_000


def test_text_report_sweep_and_compare(stub: StubServer, tmp_path: Path) -> None:
    out = tmp_path / "sweep.jsonl"
    res = _bench(stub.url, "--max-concurrency", "1,4", "--output", str(out), "--output-details")
    assert res.exit_code == 0, res.output
    text = res.stdout
    for needle in ("Serving benchmark result", "TTFT", "E2E latency", "Accept length", "Sweep summary"):
        assert needle in text
    recs = [json.loads(line) for line in out.read_text().splitlines()]
    assert [r["max_concurrency"] for r in recs] == [1, 4]
    details = recs[0]["details"]
    assert len(details["ttfts"]) == 12 and len(details["itls"][0]) == 5 and details["errors"] == [""] * 12
    assert statistics.median(details["ttfts"]) * 1000 == pytest.approx(recs[0]["median_ttft_ms"])
    # Compare the two sweep points: concurrency 4 finishes the same work in less time.
    a, b = tmp_path / "a.jsonl", tmp_path / "b.jsonl"
    a.write_text(json.dumps(recs[0]) + "\n")
    b.write_text(json.dumps(recs[1]) + "\n")
    res = runner.invoke(app, ["bench", "compare", str(a), str(b), "--format", "json"])
    assert res.exit_code == 0, res.output
    rows = {r["field"]: r for r in json.loads(res.stdout)["rows"]}
    assert rows["request_throughput"]["b"] == pytest.approx(recs[1]["request_throughput"])
    assert rows["request_throughput"]["delta"] == pytest.approx(recs[1]["request_throughput"]
                                                                - recs[0]["request_throughput"])
    res = runner.invoke(app, ["bench", "compare", str(out), str(out), "--index-a", "0"])
    assert res.exit_code == 0 and "request_throughput" in res.stdout and "better" in res.stdout


def test_server_without_extras_reports_na(tmp_path: Path) -> None:
    with StubServer(StubBehaviour(server_info=False, accept_pattern=())) as bare:
        res = _bench(bare.url, "--format", "json")
        assert res.exit_code == 0, res.output
        (rec,) = [json.loads(x) for x in res.stdout.splitlines()]
        assert rec["accept_length"] is None and rec["adaptive"] is None and rec["fingerprint"] is None
        res = _bench(bare.url)
        assert res.exit_code == 0 and "n/a" in res.stdout


def test_usage_errors_and_dead_server(tmp_path: Path) -> None:
    res = runner.invoke(app, ["bench"])
    assert res.exit_code == 2 and "exactly one of --url" in res.output
    res = runner.invoke(app, ["bench", "--url", "http://127.0.0.1:1", "--request-rate", "fast"])
    assert res.exit_code == 2 and "--request-rate" in res.output
    res = runner.invoke(app, ["bench", "compare", str(tmp_path / "none.jsonl"), str(tmp_path / "none.jsonl")])
    assert res.exit_code == 2
    with StubServer() as gone:
        url = gone.url
    # Warm-up against a dead server fails fast with exit 3 and says why.
    res = runner.invoke(app, ["bench", "--url", url, "--num-prompts", "2", "--no-progress"])
    assert res.exit_code == 3 and "warm-up" in res.output and "Traceback" not in res.output
    # Without warm-up the failures are measured, reported, and the run exits 3 (nothing completed).
    res = runner.invoke(app, ["bench", "--url", url, "--num-prompts", "2", "--warmup-requests", "0",
                              "--format", "json", "--no-progress"])
    assert res.exit_code == 3
    assert json.loads(res.stdout.splitlines()[0])["errors"] == {"connection": 2}


def test_deployment_target_fails_cleanly_without_a_launchable_deployment(tmp_path: Path) -> None:
    res = runner.invoke(app, ["bench", "-c", str(tmp_path / "missing.yaml"), "--no-progress"])
    # An unreadable deployment is unreadable input (exit 2): a message naming it, never a traceback.
    assert res.exit_code == 2, res.output
    assert "Traceback" not in res.output and "missing.yaml: no such file or preset" in res.output
    res = runner.invoke(app, ["bench", "--url", "http://127.0.0.1:1", "-c", "x.yaml"])
    assert res.exit_code == 2


def test_live_progress_on_a_terminal(stub: StubServer) -> None:
    import io

    from rich.console import Console

    from specctl.bench.config import BenchConfig, LoadPoint, WorkloadConfig
    from specctl.bench.progress import LiveProgress, make_progress
    from specctl.bench.runner import run_bench

    buf = io.StringIO()
    sink = make_progress(Console(file=buf, force_terminal=True, width=120))
    assert isinstance(sink, LiveProgress)
    try:
        workload = WorkloadConfig(num_prompts=20, random_input_len=8, random_output_len=3)
        cfg = BenchConfig(url=stub.url, workload=workload,
                          points=(LoadPoint(100.0), LoadPoint(200.0)), warmup_requests=0)
        runs = run_bench(cfg, progress=sink)
    finally:
        sink.close()
    assert [r.record["completed"] for r in runs] == [20, 20]
    assert "20/20" in buf.getvalue() and "[2/2] rate=200" in buf.getvalue()
