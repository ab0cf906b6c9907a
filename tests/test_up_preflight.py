"""The live preflight inside `specctl up` and the `engine: sglang` launch path, with REAL specctl servers.

No SGLang server can run here (no GPU), so the SGLang launch path is exercised by the SAME `Launcher` code
with one seam swapped: the planner that turns (role, instance) into argv yields `specctl serve ... --set
engine=builtin` for a deployment that says `engine: sglang`. Start-up status, /health waiting, the preflight,
the router, smg (the real binary), and shutdown all run for real. A decode whose planner adds `--set
serve.max_batch_size=2` resolves differently from the deployment (something the builtin handshake does not
compare: it is not exchanged between prefill and decode, like SGLang's own resolved `max_running_requests`)
and must be refused before the router starts.
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

from specctl.engine.checkpoint import write_random_model
from specctl.errors import RuntimeFailure
from specctl.orchestrate.launcher import Launcher, Planner, PreflightRefused, ProcessStatus
from specctl.orchestrate.ports import free_ports
from specctl.schemas.validator import load_deployment

pytestmark = pytest.mark.slow

ENV = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
START_TIMEOUT = 240.0


@pytest.fixture(scope="module")
def models(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("up-models")
    return {"target": write_random_model(root / "target", layer_kinds=("swa", "full")),
            "draft": write_random_model(root / "draft", layer_kinds=("full",), seed=1)}


def write_deployment(path: Path, models: dict[str, Path], *, engine: str, prefills: int = 1) -> Path:
    port = iter(free_ports(2 * prefills + 2))
    path.write_text(f"""version: 1
name: {path.stem}
engine: {engine}
model: {{target: {models['target']}, dtype: float32, device: cpu}}
speculative:
  algorithm: draft
  draft: {models['draft']}
  num_steps: 1
  adaptive:
    buckets:
      1: {{candidate_steps: [1, 2]}}
cache: {{page_size: 4, max_tokens: 512}}
serve: {{max_batch_size: 4}}
transfer: {{backend: zmq, timeout_s: 10}}
roles:
  prefill:
{"".join(f"    - {{host: 127.0.0.1, port: {next(port)}, bootstrap_port: {next(port)}}}{chr(10)}"
         for _ in range(prefills))}  decode: {{host: 127.0.0.1, port: {next(port)}}}
  router: {{host: 127.0.0.1, port: {next(port)}}}
""")
    return path


def builtin_planner(config: Path, decode_sets: tuple[str, ...] = ()) -> Planner:
    """The one seam: `specctl serve` of the builtin engine for each role of an `engine: sglang` file."""
    def plan(role: str, index: int) -> list[str]:
        argv = [sys.executable, "-m", "specctl.cli", "serve", "--role", role, "-c", str(config),
                "--instance", str(index), "--set", "engine=builtin"]
        for s in decode_sets if role == "decode" else ():
            argv += ["--set", s]
        return argv
    return plan


def test_up_reports_the_pair_preflight_and_stops_on_sigterm(tmp_path: Path, models: dict[str, Path]) -> None:
    cfg = write_deployment(tmp_path / "builtin.yaml", models, engine="builtin")
    proc = subprocess.Popen([sys.executable, "-m", "specctl.cli", "up", "-c", str(cfg), "--format", "json",
                             "--timeout", str(START_TIMEOUT), "--log-dir", str(tmp_path / "logs")],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=ENV)
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()
        assert line, proc.stderr.read() if proc.stderr else ""
        ready = json.loads(line)
        assert ready["ok"] is True and ready["engine"] == "builtin"
        [pair] = ready["preflight"]
        assert (pair["prefill_instance"], pair["decode_instance"], pair["ok"]) == ("prefill", "decode", True)
        assert pair["differences"] == [] and pair["deployment_differences"] == []
        assert pair["fingerprints"]["prefill"] == pair["fingerprints"]["decode"]
        with urllib.request.urlopen(ready["url"] + "/readiness", timeout=5) as r:  # noqa: S310 - loopback
            assert r.status == 200
        proc.send_signal(signal.SIGTERM)
        out, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate(timeout=10)
    assert proc.returncode == 0, err
    stopped = json.loads(out.strip().splitlines()[-1])
    assert stopped["ok"] is True and set(stopped["stopped"]) == {"prefill", "decode", "router"}
    assert "preflight: 1 prefill/decode pair(s) agree" in err
    # Not a terminal: one plain status line per change, with the elapsed time since the process started.
    assert re.search(r"^  prefill +ready +\d+\.\ds", err, re.M) and re.search(r"^  router +waiting", err, re.M)
    assert "Traceback" not in err


def test_sglang_launch_path_runs_status_health_preflight_router_and_shutdown(
        tmp_path: Path, models: dict[str, Path]) -> None:
    cfg = write_deployment(tmp_path / "sglang.yaml", models, engine="sglang")
    dep = load_deployment(cfg)
    launcher = Launcher(dep, log_dir=tmp_path / "logs", planner=builtin_planner(cfg))
    assert launcher.engine == "sglang"
    seen: list[list[ProcessStatus]] = []
    try:
        launcher.start()
        launcher.wait_ready(START_TIMEOUT, on_status=lambda s: seen.append([dataclasses.replace(x) for x in s]))
        assert launcher.preflight_reports is not None
        [pair] = launcher.preflight_reports
        assert pair.report.ok and pair.report.prefill.role == "prefill" and pair.report.decode.role == "decode"
        with urllib.request.urlopen(launcher.url + "/readiness", timeout=5) as r:  # noqa: S310 - loopback
            assert r.status == 200
        # Live status while starting: every engine was seen not ready with an elapsed time, before it was ready.
        first = {s.role: s for s in seen[0]}
        assert not first["prefill"].ready and first["router"].state == "waiting"
        starting = [s for snap in seen for s in snap if s.role == "decode" and not s.ready]
        assert starting and all(s.detail for s in starting)  # its last log line, or what it waits for
        assert all(s.ready for s in seen[-1]) and seen[-1][0].elapsed() > 0
        # The router was spawned only after the preflight passed (it is what gates the spawn).
        assert "router" in launcher.procs
    finally:
        codes = launcher.stop()
    assert set(codes) == {"prefill", "decode", "router"} and all(c is not None for c in codes.values())


def test_a_decode_that_resolves_differently_is_refused_before_the_router_starts(
        tmp_path: Path, models: dict[str, Path]) -> None:
    cfg = write_deployment(tmp_path / "drift.yaml", models, engine="sglang")
    dep = load_deployment(cfg)
    launcher = Launcher(dep, log_dir=tmp_path / "logs",
                        planner=builtin_planner(cfg, ("serve.max_batch_size=2",)))
    try:
        launcher.start()
        with pytest.raises(PreflightRefused) as info:
            launcher.wait_ready(START_TIMEOUT)
    finally:
        codes = launcher.stop()
    err = info.value
    assert err.exit_code == 3
    assert "router" not in launcher.procs and "router" not in codes  # never started
    assert all(c is not None for c in codes.values())  # everything it started is stopped
    [pair] = err.pairs
    drift = {(d.role, d.field, d.asked, d.running) for d in pair.report.drifts}
    assert drift == {("decode", "max_running_requests", 4, 2)}
    assert "max_running_requests (decode): deployment asked 4, the server runs 2" in str(err)
    assert "--max-running-requests" in str(err)  # the fix names the SGLang flag


def test_sglang_engine_without_sglang_fails_before_anything_starts(tmp_path: Path, models: dict[str, Path]) -> None:
    no_sglang = tmp_path / "python-without-sglang"
    no_sglang.write_text(f'#!/bin/sh\nexec {sys.executable} -S "$@"\n')  # -S: no site-packages, so no sglang
    no_sglang.chmod(0o755)
    cfg = write_deployment(tmp_path / "nosglang.yaml", models, engine="sglang")
    launcher = Launcher(load_deployment(cfg, overrides=(f"sglang.python={no_sglang}",)), log_dir=tmp_path / "l")
    try:
        with pytest.raises(RuntimeFailure) as info:
            launcher.start()
    finally:
        launcher.stop()
    assert "SGLang is not importable by" in str(info.value) and "sglang.python" in (info.value.hint or "")
    assert launcher.procs == {}
    # `specctl serve` says the same, exit 3, no traceback.
    t0 = time.monotonic()
    res = subprocess.run([sys.executable, "-m", "specctl.cli", "serve", "--role", "prefill", "-c", str(cfg),
                          "--set", f"sglang.python={no_sglang}"], capture_output=True, text=True, env=ENV,
                         timeout=120)
    assert res.returncode == 3, res.stderr
    assert "SGLang is not importable by" in res.stderr and "--set sglang.python=" in res.stderr
    assert "Traceback" not in res.stderr and time.monotonic() - t0 < 120


def test_a_server_that_dies_is_named_with_its_exit_status_and_last_log_lines(
        tmp_path: Path, models: dict[str, Path]) -> None:
    cfg = write_deployment(tmp_path / "dies.yaml", models, engine="sglang")
    plan = builtin_planner(cfg)

    def planner(role: str, index: int) -> list[str]:  # decode: the real sglang path, with no SGLang to run
        if role == "decode":
            return [sys.executable, "-m", "specctl.cli", "serve", "--role", "decode", "-c", str(cfg),
                    "--set", f"sglang.python={tmp_path / 'no-such-python'}"]
        return plan(role, index)

    launcher = Launcher(load_deployment(cfg), log_dir=tmp_path / "logs", planner=planner)
    try:
        launcher.start()
        with pytest.raises(RuntimeFailure) as info:
            launcher.wait_ready(START_TIMEOUT)
    finally:
        codes = launcher.stop()
    msg = str(info.value)
    assert msg.startswith(f"decode (pid {launcher.procs['decode'].pid}) exited with code 3: exit code 3")
    assert "--- last lines of" in msg and "cannot run the SGLang Python" in msg
    assert "router" not in codes and all(c is not None for c in codes.values())


def test_every_prefill_decode_pair_is_preflighted(tmp_path: Path, models: dict[str, Path]) -> None:
    cfg = write_deployment(tmp_path / "two.yaml", models, engine="builtin", prefills=2)
    launcher = Launcher(load_deployment(cfg), log_dir=tmp_path / "logs")
    try:
        launcher.start()
        launcher.wait_ready(START_TIMEOUT)
        pairs = launcher.preflight_reports or []
        assert [(p.prefill, p.decode) for p in pairs] == [("prefill", "decode"), ("prefill.1", "decode")]
        assert all(p.report.ok for p in pairs)
        assert pairs[0].report.prefill.url != pairs[1].report.prefill.url
    finally:
        launcher.stop()


def test_up_format_json_reports_a_launch_failure(tmp_path: Path, models: dict[str, Path]) -> None:
    cfg = write_deployment(tmp_path / "json.yaml", models, engine="sglang")
    res = subprocess.run([sys.executable, "-m", "specctl.cli", "up", "-c", str(cfg), "--format", "json",
                          "--set", f"sglang.python={tmp_path / 'no-such-python'}"],
                         capture_output=True, text=True, env=ENV, timeout=120)
    assert res.returncode == 3, res.stderr
    doc = json.loads(res.stdout)
    assert doc["ok"] is False and "cannot run the SGLang Python" in doc["error"] and doc["preflight"] == []
    assert "sglang.python" in doc["hint"] and "Traceback" not in res.stderr
