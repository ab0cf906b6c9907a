"""`specctl serve --role prefill|decode` with `engine: sglang`: the command it execs is the exported one.

`--print-command` prints what `serve` would exec (the same `role_command` the exec and `specctl up` use);
it must equal `export_commands`' argv with the SGLang interpreter in front, and SGLang's own parser
(tests/sglang_oracle.py, a child process; skipped without sglang) must accept it with the deployment's
values. No real SGLang server runs here (no GPU): the launch itself is exercised in test_up_preflight.py.
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

from specctl.cli.main import app
from specctl.orchestrate.sglang_process import adaptive_file_for, default_workdir
from specctl.schemas.deployment import load_deployment
from specctl.schemas.sglang.export import export_commands

ROOT = Path(__file__).resolve().parent.parent
runner = CliRunner()
CASES = [("tiny-pd", "prefill", ()), ("tiny-pd", "decode", ()), ("llama-3.1-8b-pd", "prefill", ()),
         ("llama-3.1-8b-pd", "decode", ("speculative.adaptive=null",)), ("tiny-colocated", "colocated", ())]


def printed(preset: str, role: str, sets: tuple[str, ...]) -> dict[str, Any]:
    args = ["serve", "--role", role, "-c", preset, "--set", "engine=sglang", "--print-command"]
    for s in sets:
        args += ["--set", s]
    res = runner.invoke(app, args)
    assert res.exit_code == 0, res.output
    out: dict[str, Any] = json.loads(res.stdout)
    return out


@pytest.mark.parametrize(("preset", "role", "sets"), CASES)
def test_the_exec_argv_is_the_exported_command(preset: str, role: str, sets: tuple[str, ...]) -> None:
    got = printed(preset, role, sets)
    dep = load_deployment(preset, overrides=("engine=sglang", *sets))
    adaptive = adaptive_file_for(default_workdir(dep), role)
    cmds = export_commands(dep, adaptive_file=adaptive)
    exported = getattr(cmds, role)
    assert exported is not None and exported[:3] == ["python", "-m", "sglang.launch_server"]
    assert got["argv"] == [sys.executable, *exported[1:]]
    assert got["files"] == {k: v for k, v in cmds.files.items() if k in exported}
    assert got["env"] == {"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}


def test_sglang_python_is_the_interpreter_of_the_command() -> None:
    got = printed("tiny-pd", "decode", ("sglang.python=/opt/sglang/bin/python",))
    assert got["argv"][:3] == ["/opt/sglang/bin/python", "-m", "sglang.launch_server"]


def test_print_command_needs_engine_sglang() -> None:
    res = runner.invoke(app, ["serve", "--role", "prefill", "-c", "tiny-pd", "--print-command"])
    assert res.exit_code == 2 and "engine=sglang" in res.output


@pytest.mark.slow
@pytest.mark.skipif(importlib.util.find_spec("sglang") is None,
                    reason="sglang is not installed (scripts/setup.sh installs it --no-deps)")
def test_the_exec_argv_parses_with_sglangs_parser() -> None:
    argvs = [printed(p, r, s)["argv"] for p, r, s in CASES]
    requests = [{"op": "parse", "argv": a[3:], "abbrev": False} for a in argvs]
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
    proc = subprocess.run([sys.executable, str(ROOT / "tests" / "sglang_oracle.py")], input=json.dumps(requests),
                          capture_output=True, text=True, timeout=240, env=env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    for (preset, role, sets), answer in zip(CASES, json.loads(proc.stdout), strict=True):
        assert answer["ok"], (preset, role, answer["error"])
        v = answer["values"]
        cfg = load_deployment(preset, overrides=sets).role(role)
        assert v["port"] == cfg.port and v["page_size"] == cfg.cache.page_size
        assert v["disaggregation_mode"] == (role if role != "colocated" else "null")
        assert v["speculative_adaptive"] is (cfg.speculative.adaptive is not None)
        if v["speculative_adaptive"]:
            assert v["speculative_adaptive_config"] == adaptive_file_for(
                default_workdir(load_deployment(preset)), role)
