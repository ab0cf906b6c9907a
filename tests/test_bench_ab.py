"""`specctl bench --ab` / `--ab-url` on stub servers with known timings: the known ratios come out.

Stub A streams a token every 8 ms, stub B every 4 ms (first token after one gap too), requests one at a
time: B's output throughput is 2x A's and its TPOT half, and the bootstrap interval brackets that.
Also: variants of a deployment get their own free ports; bad --ab values are usage errors.
"""

from __future__ import annotations

import json
import os
import struct
from collections.abc import Iterator
from pathlib import Path

import pytest
from typer.testing import CliRunner

from specctl.bench.ab import FILLED_WARN, bootstrap_ratio, parse_ab, port_overrides
from specctl.bench.stub_server import StubBehaviour, StubServer
from specctl.cli.main import app
from specctl.errors import UsageError
from specctl.orchestrate.ports import free_port

runner = CliRunner()


@pytest.fixture(scope="module")
def stubs() -> Iterator[tuple[StubServer, StubServer]]:
    with StubServer(StubBehaviour(ttft_s=0.008, itl_s=0.008)) as a, StubServer(
            StubBehaviour(ttft_s=0.004, itl_s=0.004)) as b:
        yield a, b


def test_ab_url_gives_the_known_ratio_with_an_interval(stubs, tmp_path: Path):
    a, b = stubs
    out, png = tmp_path / "ab.jsonl", tmp_path / "ab.png"
    res = runner.invoke(app, ["bench", "--url", a.url, "--ab-url", b.url, "--num-prompts", "20", "--ab-rounds", "5",
                              "--random-input-len", "8", "--random-output-len", "12", "--max-concurrency", "1",
                              "--no-progress", "--format", "json", "--output", str(out), "--plot", str(png)])
    assert res.exit_code == 0, res.output
    *runs, comp = [json.loads(line) for line in res.stdout.splitlines()]  # JSON Lines, as --output appends
    assert comp["kind"] == "ab-comparison" and [json.loads(x) for x in out.read_text().splitlines()][-1] == comp
    base, other = runs
    assert base["completed"] == other["completed"] == 20
    assert base["ab"]["variant"] == "base" and len(base["ab"]["rounds"]) == 5
    row = comp["variants"][1]
    thr = row["output_throughput_ratio"]
    # 2x, less the client's and the stub's own time per token, which a loaded machine stretches: with two
    # CPU burners on 2 cores it measured 1.57x (1.96x idle); swapped variants give 0.5x, no effect 1.0x.
    assert 1.4 < thr["ratio"] < 2.3, thr
    lo, hi = thr["ci95"]
    # The interval brackets the ratio and excludes "no difference"; its width is the machine's noise (under
    # a CPU burner it reached 0.8, so only an absurd width fails).
    assert 1.0 < lo <= thr["ratio"] <= hi < 3.0
    tpot = row["mean_tpot_ms_ratio"]
    assert 0.4 < tpot["ratio"] < 0.72, tpot  # 0.5x, plus the same per-token overhead
    # JSONL: one record per variant, then the comparison
    lines = [json.loads(x) for x in out.read_text().splitlines()]
    assert [x.get("kind") for x in lines] == [None, None, "ab-comparison"]
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert struct.unpack(">II", png.read_bytes()[16:24])[0] > 100
    # the text report ends with the comparison table
    res = runner.invoke(app, ["bench", "--url", a.url, "--ab-url", b.url, "--num-prompts", "4", "--ab-rounds", "2",
                              "--random-output-len", "4", "--max-concurrency", "1", "--no-progress"])
    assert res.exit_code == 0, res.output
    assert "A/B: ratio to base" in res.stdout


def test_bootstrap_ratio_is_paired_and_brackets_the_point():
    base = [{"tokens": 100.0, "duration": d, "ttft_sum": 0.0, "ttft_n": 0.0, "tpot_sum": 0.0, "tpot_n": 0.0,
             "acc": 2.0} for d in (1.0, 2.0, 1.5, 3.0)]
    # the variant is exactly 1.5x faster in every round, whatever the round's drift
    other = [{**r, "duration": r["duration"] / 1.5} for r in base]
    ratio, lo, hi = bootstrap_ratio(base, other, "output_throughput")
    assert ratio == pytest.approx(1.5) and lo == pytest.approx(1.5) and hi == pytest.approx(1.5)


def test_variants_move_every_role_port_and_bad_values_are_usage_errors():
    raw = {"roles": {"prefill": {"port": 30001, "bootstrap_port": 8998}, "router": {"port": 30000},
                     "decode": {"host": "127.0.0.1"}}}
    moved = port_overrides(raw)
    keys = sorted(m.split("=")[0] for m in moved)
    assert keys == ["roles.prefill.bootstrap_port", "roles.prefill.port", "roles.router.port"]
    ports = [int(m.split("=")[1]) for m in moved]
    assert len(set(ports)) == 3 and not {30000, 30001, 8998} & set(ports)
    assert parse_ab(["speculative.algorithm=none", "a=1;b=2"]) == [("speculative.algorithm=none",), ("a=1", "b=2")]
    for bad in ("novalue", "=3", ""):
        with pytest.raises(UsageError):
            parse_ab([bad])
    res = runner.invoke(app, ["bench", "--url", "http://127.0.0.1:9", "--ab", "x=1"])
    assert res.exit_code == 2 and "-c DEPLOY" in res.output


@pytest.mark.slow
def test_ab_launches_a_variant_next_to_the_deployment_and_traces_the_base(tmp_path: Path) -> None:
    """The issue's command on the colocated builtin preset: base (speculative) vs algorithm=none."""
    import subprocess
    import sys

    port = free_port()
    trace = tmp_path / "verify.jsonl"
    proc = subprocess.run(
        [sys.executable, "-m", "specctl.cli", "bench", "-c", "tiny-colocated", "--set", f"roles.colocated.port={port}",
         "--ab", "speculative.algorithm=none", "--ab-rounds", "2", "--num-prompts", "4", "--max-concurrency", "2",
         "--dataset-name", "code", "--random-output-len", "12", "--no-progress", "--format", "json",
         "--trace-out", str(trace), "--trace-steps", "3"],
        capture_output=True, text=True, timeout=300,
        env={**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"})
    assert proc.returncode == 0, proc.stderr[-3000:]
    *runs, comp = [json.loads(line) for line in proc.stdout.splitlines()]
    base, none = runs
    assert base["completed"] == none["completed"] == 4
    assert base["url"] == f"http://127.0.0.1:{port}" and none["url"] != base["url"]  # side by side
    assert base["deployment"]["config"]["speculative"]["algorithm"] == "draft"
    assert none["ab"]["overrides"] == ["speculative.algorithm=none"]
    ratio = comp["variants"][1]["output_throughput_ratio"]["ratio"]
    assert isinstance(ratio, float) and ratio > 0
    # only the speculative base verifies: its trace drafts 3 every step
    lines = [json.loads(x) for x in trace.read_text().splitlines()]
    assert lines and all(x["trace_steps"] == 3 and x["steps"] == 3 for x in lines)


def test_filled_seconds_counts_the_time_at_full_concurrency():
    from specctl.bench.ab import filled_seconds
    from specctl.bench.config import LoadPoint
    from specctl.bench.load import LoadResult
    from specctl.bench.request import RequestResult

    def req(i: int, sent: float, end: float) -> RequestResult:
        return RequestResult(index=i, prompt_len=1, output_len=1, scheduled=sent, sent=sent, end=end)

    # two clients, both busy over [1, 4]: request 2 starts as request 0 ends, request 3 as request 2 does
    load = LoadResult(LoadPoint(max_concurrency=2), [req(0, 0, 3), req(1, 1, 4), req(2, 3, 3.5), req(3, 3.5, 5)],
                      start=0.0, wall_start=0.0, mono_start=0.0, end=5.0)
    assert filled_seconds(load, 2) == pytest.approx(3.0)
    assert filled_seconds(load, 1) == pytest.approx(5.0)
    assert filled_seconds(load, 3) == 0.0


def test_small_rounds_get_a_note_on_their_ramp_up_and_drain(stubs):
    a, b = stubs
    small = ["bench", "--url", a.url, "--ab-url", b.url, "--num-prompts", "4", "--ab-rounds", "2",
             "--random-output-len", "4", "--no-progress"]
    # 2 prompts per round at --max-concurrency 4: the rounds never fill, and the report says so
    res = runner.invoke(app, [*small, "--max-concurrency", "4", "--format", "json"])
    assert res.exit_code == 0, res.output
    comp = [json.loads(line) for line in res.stdout.splitlines()][-1]
    assert [row["filled_share"] for row in comp["variants"]] == [0.0, 0.0]
    assert comp["variants"][0]["prompts_per_round"] == 2
    res = runner.invoke(app, [*small, "--max-concurrency", "4"])
    assert res.exit_code == 0, res.output
    assert "in flight for only part of the measured time (base 0%" in " ".join(res.stdout.split())
    # one client at a time: always full, no note
    res = runner.invoke(app, [*small, "--max-concurrency", "1", "--format", "json"])
    comp = [json.loads(line) for line in res.stdout.splitlines()][-1]
    assert all(row["filled_share"] >= FILLED_WARN for row in comp["variants"]), comp["variants"]
