"""`specctl generate`: through Typer's CliRunner and as a real subprocess, on a tiny random model.

Oracle: the CLI's tokens are the Python API's tokens for the same deployment and prompt.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from specctl.cli.main import app
from specctl.engine.checkpoint import write_random_model
from specctl.engine.config import EngineConfig
from specctl.engine.engine import Engine
from specctl.engine.sampling_params import SamplingParams

PROMPT = "def fib(n):"


@pytest.fixture(scope="module")
def deploy(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("gen")
    model = write_random_model(root / "model")
    path = root / "deploy.yaml"
    path.write_text(
        "version: 1\n"
        "name: gen-test\n"
        f"model: {{target: {json.dumps(str(model))}, dtype: float32, device: cpu}}\n"
        "cache: {page_size: 4, max_tokens: 256}\n"
        "serve: {max_batch_size: 4}\n",
        encoding="utf-8",
    )
    return path


def invoke(*args: str) -> tuple[int, str, str]:
    res = CliRunner().invoke(app, ["generate", *args], env={"COLUMNS": "200", "NO_COLOR": "1"})
    return res.exit_code, res.stdout, res.stderr


def api_tokens(deploy: Path, n: int, **params: object) -> list[int]:
    from specctl.schemas.deployment import load_deployment

    engine = Engine(EngineConfig.from_role(load_deployment(deploy).role("colocated")))
    return engine.generate([PROMPT], SamplingParams(max_tokens=n, ignore_eos=True, **params))[0].token_ids  # type: ignore[arg-type]


def test_json_output_matches_python_api(deploy: Path) -> None:
    args = ["-c", str(deploy), "--prompt", PROMPT, "--max-tokens", "12", "--ignore-eos", "--format", "json"]
    code, out, err = invoke(*args)
    assert code == 0, err
    data = json.loads(out)
    assert {"text", "token_ids", "finish_reason", "timing", "speculative"} <= data.keys()
    assert data["finish_reason"] == "length" and len(data["token_ids"]) == 12
    assert {"ttft_s", "total_s", "tokens_per_s"} <= data["timing"].keys()
    assert data["timing"]["ttft_s"] <= data["timing"]["total_s"]
    assert data["speculative"] == {}  # plain decoding
    assert data["token_ids"] == api_tokens(deploy, 12)


def test_seeded_sampling_is_reproducible_from_the_cli(deploy: Path) -> None:
    args = ["-c", str(deploy), "--prompt", PROMPT, "--max-tokens", "16", "--ignore-eos", "--format", "json"]
    a = json.loads(invoke(*args, "--temperature", "1.0", "--seed", "3")[1])
    b = json.loads(invoke(*args, "--temperature", "1.0", "--seed", "3")[1])
    assert a["token_ids"] == b["token_ids"]
    assert a["token_ids"] == api_tokens(deploy, 16, temperature=1.0, seed=3)


def test_text_output_shows_prompt_and_continuation(deploy: Path) -> None:
    code, out, err = invoke("-c", str(deploy), "--prompt", PROMPT, "--max-tokens", "4")
    assert code == 0, err
    assert out.startswith(PROMPT)
    assert "4 tokens" in err and "finish=" in err


def test_speculation_reports_acceptance(deploy: Path) -> None:
    code, out, err = invoke(
        "-c", str(deploy), "--set", "speculative.algorithm=ngram", "--set", "speculative.num_steps=2",
        "--prompt", PROMPT, "--max-tokens", "10", "--ignore-eos", "--format", "json",
    )  # fmt: skip
    assert code == 0, err
    data = json.loads(out)
    spec = data["speculative"]
    assert spec["verify_steps"] >= 1 and len(spec["accepted_per_step"]) == spec["verify_steps"]
    assert all(0 <= a <= 2 for a in spec["accepted_per_step"])
    assert "speculative_engine" in data
    # greedy speculation reproduces plain greedy decoding
    assert data["token_ids"] == api_tokens(deploy, 10)


@pytest.mark.parametrize(
    ("args", "code"),
    [
        (["--temperature", "-1"], 1),  # invalid sampling option
        (["--max-tokens", "1000"], 3),  # can never fit the 256-token pool: the request fails
    ],
)
def test_failures_map_to_exit_codes(deploy: Path, args: list[str], code: int) -> None:
    got, out, err = invoke("-c", str(deploy), "--prompt", PROMPT, *args)
    assert got == code, (out, err)
    assert "error:" in err and "Traceback" not in err


def test_failed_request_still_prints_json(deploy: Path) -> None:
    code, out, err = invoke("-c", str(deploy), "--prompt", PROMPT, "--max-tokens", "1000", "--format", "json")
    assert code == 3
    data = json.loads(out)
    assert data["finish_reason"] == "error" and "cache.max_tokens" in data["error"]


def test_router_role_runs_no_engine(deploy: Path) -> None:
    code, _, err = invoke("-c", str(deploy), "--role", "router", "--prompt", PROMPT)
    assert code == 2 and "engine role" in err


def test_unreadable_deployment_is_a_usage_error(tmp_path: Path) -> None:
    code, _, err = invoke("-c", str(tmp_path / "missing.yaml"), "--prompt", PROMPT)
    assert code == 2 and "error:" in err


@pytest.mark.slow
def test_real_subprocess_json(deploy: Path) -> None:
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    cmd = [sys.executable, "-m", "specctl.cli", "generate", "-c", str(deploy), "--prompt", PROMPT,
           "--max-tokens", "8", "--ignore-eos", "--format", "json"]  # fmt: skip
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=240, env=env)
    assert proc.returncode == 0, proc.stderr
    data = json.loads(proc.stdout)
    assert data["token_ids"] == api_tokens(deploy, 8)
    assert data["finish_reason"] == "length" and data["timing"]["tokens_per_s"] > 0
