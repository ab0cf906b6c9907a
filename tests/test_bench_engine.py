"""`specctl bench -c` against the real engine: launch the colocated builtin preset, bench, tear down."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from specctl.orchestrate.ports import free_port


@pytest.mark.slow
def test_bench_launches_benches_and_tears_down_the_builtin_deployment(tmp_path: Path) -> None:
    port = free_port()
    out, png = tmp_path / "r.jsonl", tmp_path / "r.png"
    proc = subprocess.run(
        [sys.executable, "-m", "specctl.cli", "bench", "-c", "tiny-colocated", "--set", f"roles.colocated.port={port}",
         "--num-prompts", "6", "--max-concurrency", "3", "--dataset-name", "code", "--random-output-len", "16",
         "--no-progress", "--format", "json", "--output", str(out), "--plot", str(png)],
        capture_output=True, text=True, timeout=240,
        env={**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"})
    assert proc.returncode == 0, proc.stderr[-3000:]
    (rec,) = [json.loads(x) for x in proc.stdout.splitlines()]
    assert rec["completed"] == 6 and rec["errors"] == {}
    assert rec["url"] == f"http://127.0.0.1:{port}"
    # Real speculative statistics per request, from the engine's usage.
    assert rec["accept_length_source"] == "usage" and rec["accept_length"] >= 1.0
    assert rec["spec_verify_steps"] > 0
    assert rec["total_output_tokens"] == 6 * 16
    assert rec["mean_ttft_ms"] > 0 and rec["p99_e2e_latency_ms"] >= rec["p99_ttft_ms"]
    # Traceability: the resolved deployment and the engine's fingerprint are in the record.
    assert rec["deployment"]["name"] == "tiny-colocated"
    assert rec["deployment"]["config"]["speculative"]["algorithm"] == "draft"
    assert rec["fingerprint"] and "weights_hash" in rec["fingerprint"]
    assert json.loads(out.read_text().splitlines()[0])["completed"] == 6
    assert png.read_bytes()[:4] == b"\x89PNG"
    # Torn down: nothing listens on the deployment's port any more.
    with socket.socket() as s:
        assert s.connect_ex(("127.0.0.1", port)) != 0
