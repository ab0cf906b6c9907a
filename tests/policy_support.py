"""Helpers for the adaptive-policy knob tests (test_zero_backoff.py, test_zero_threshold.py): a deployment
bucket built from knobs, the steps a policy runs on a stream of accepted counts, and the same stream run
through SGLang's own `AdaptiveSpeculativeParams` in a child process (the test process never imports
sglang). Torch-free.
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from specctl.adaptive.policy import AdaptivePolicy
from specctl.cli.main import app
from specctl.schemas.adaptive import AdaptiveConfig, parse_deployment_adaptive

ROOT = Path(__file__).resolve().parent.parent
ENV = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}  # no hub, ever: every child
FAST = {"ema_alpha": 1.0, "warmup_batches": 0, "update_interval": 1}  # the EMA is the last batch; decide each


def deployment_cfg(cands: list[int], **knobs: Any) -> AdaptiveConfig:
    """One bucket (batch size 1 up) of a deployment's adaptive block with these knobs; no findings."""
    cfg, findings = parse_deployment_adaptive({**knobs, "buckets": {1: {"candidate_steps": cands}}})
    assert cfg is not None and not findings, findings
    return cfg


def policy_steps(cfg: AdaptiveConfig, stream: list[int], *, initial: int, counterfactual: bool = False) -> list[int]:
    """The steps each batch (one request) ran with; `stream` is what a drafter drafting all it can would
    accept, fed as min(a, steps) (0 at steps 0) when `counterfactual`, else as given."""
    p = AdaptivePolicy(cfg, initial_steps=initial)
    ran = []
    for a in stream:
        k = p.steps_for_batch(1)
        ran.append(k)
        p.on_verify_complete([min(a, k)] if counterfactual else [a], 1)
    return ran


_SGLANG_CHILD = """
import json, sys, contextlib, io
sys.path.insert(0, sys.argv[1])
from gen_sglang_flags import install_triton_stub
install_triton_stub()
with contextlib.redirect_stdout(io.StringIO()):
    from sglang.srt.speculative.adaptive_spec_params import AdaptiveSpeculativeParams
req = json.loads(sys.stdin.read())
p = AdaptiveSpeculativeParams(initial_steps=req["initial"], cfg_path=req["path"])
ran = []
for a in req["stream"]:
    ran.append(p.get_steps_for_batch(1))
    p.on_verify_complete([a], 1)
print(json.dumps(ran))
"""

needs_sglang = pytest.mark.skipif(importlib.util.find_spec("sglang") is None,
                                  reason="sglang is not installed (scripts/setup.sh installs it --no-deps)")


def sglang_steps(obj: dict[str, Any], tmp_path: Path, stream: list[int], *, initial: int) -> list[int]:
    """The steps SGLang's own policy runs, batch by batch, reading `obj` as its adaptive config file and fed
    `stream` as given."""
    path = tmp_path / "adaptive.json"
    path.write_text(json.dumps(obj))
    proc = subprocess.run([sys.executable, "-c", _SGLANG_CHILD, str(ROOT / "scripts")], capture_output=True,
                          text=True, timeout=120, env=ENV,
                          input=json.dumps({"path": str(path), "initial": initial, "stream": stream}))
    assert proc.returncode == 0, proc.stderr[-2000:]
    return [int(s) for s in json.loads(proc.stdout.strip().splitlines()[-1])]


def validate_tiny_pd(*sets: str) -> tuple[int, list[dict[str, Any]]]:
    """(exit code, findings) of `specctl validate tiny-pd --set S ... --format json`."""
    res = CliRunner().invoke(app, ["validate", "tiny-pd", *[a for s in sets for a in ("--set", s)], "--format", "json"])
    return res.exit_code, json.loads(res.stdout)["files"][0]["findings"]
