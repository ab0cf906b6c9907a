"""Test-only fault injection goes through an explicit, hidden `serve --fault-plan FILE` (engine/serve/faults.py),
read once at start-up: never from the environment, never per request. The faults themselves run end to end
in tests/test_serve_pd.py (a held transfer, a corrupted payload)."""

from __future__ import annotations

import ast
import dataclasses
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from specctl.engine.serve.faults import FaultPlan
from specctl.errors import UsageError

ENV = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}


def test_a_plan_file_is_read_strictly(tmp_path: Path) -> None:
    good = tmp_path / "good.json"
    good.write_text(json.dumps({"prefill_hold_s": 1.5, "prefill_corrupt_marker": "XYZ"}))
    assert FaultPlan.from_file(good) == FaultPlan(prefill_hold_s=1.5, prefill_corrupt_marker="XYZ")
    assert FaultPlan() == FaultPlan(prefill_hold_s=0.0, prefill_corrupt_marker="")  # production: no faults
    for body, needle in [({"hold_s": 1}, "unknown key"), ({"prefill_hold_s": -1}, "prefill_hold_s"),
                         ({"prefill_hold_s": True}, "prefill_hold_s"), ([1], "JSON object"),
                         ({"prefill_corrupt_marker": 3}, "prefill_corrupt_marker")]:
        bad = tmp_path / "bad.json"
        bad.write_text(json.dumps(body))
        with pytest.raises(UsageError, match=needle):
            FaultPlan.from_file(bad)


def test_the_option_is_hidden_and_a_bad_plan_is_a_usage_error(tmp_path: Path) -> None:
    cli = [sys.executable, "-m", "specctl.cli", "serve"]
    helped = subprocess.run([*cli, "--help"], capture_output=True, text=True, env=ENV, timeout=60)
    assert helped.returncode == 0 and "--role" in helped.stdout and "--fault-plan" not in helped.stdout
    bad = tmp_path / "plan.json"
    bad.write_text('{"hold": 1}')
    res = subprocess.run([*cli, "--role", "prefill", "-c", "tiny-pd", "--fault-plan", str(bad)],
                         capture_output=True, text=True, env=ENV, timeout=60)
    assert res.returncode == 2, res.stderr
    assert "unknown key" in res.stderr and "hold" in res.stderr and "Traceback" not in res.stderr


def _env_reads(tree: ast.AST) -> set[str]:
    """The literal names read with os.environ.get(X) / os.environ[X] / os.getenv(X)."""
    names: set[str] = set()
    for node in ast.walk(tree):
        key: ast.expr | None = None
        if isinstance(node, ast.Call) and node.args and ast.unparse(node.func) in {"os.environ.get", "os.getenv"}:
            key = node.args[0]
        elif isinstance(node, ast.Subscript) and ast.unparse(node.value) == "os.environ":
            key = node.slice
        if isinstance(key, ast.Constant) and isinstance(key.value, str):
            names.add(key.value)
    return names


def test_no_serving_module_reads_a_test_fault_from_the_environment() -> None:
    root = Path(__file__).resolve().parents[1]
    read: set[str] = set()
    paths = [p for folder in ("engine/serve", "engine/pd", "orchestrate") for p in (root / folder).glob("*.py")]
    for path in paths:
        text = path.read_text(encoding="utf-8")
        assert "SPECCTL_TEST" not in text, path
        read |= _env_reads(ast.parse(text))
    # Only log levels come from the environment (and the secret whose name the deployment gives).
    assert read == {"SPECCTL_LOG_LEVEL", "SPECCTL_ROUTER_LOG_LEVEL"}, read


def test_faults_reach_library_code_through_the_plan_object_only() -> None:
    """A fault's name appears in library code only as an attribute of the plan the role context carries, in the
    modules that inject it: no other module, and no other spelling (a key looked up, an environment name)."""
    root = Path(__file__).resolve().parents[1]
    fields = {f.name for f in dataclasses.fields(FaultPlan)}
    users: dict[str, set[str]] = {}
    for path in root.rglob("*.py"):
        rel = path.relative_to(root).as_posix()
        if rel.startswith(("tests/", ".venv/", "build/")) or rel == "engine/serve/faults.py":
            continue
        tree = ast.parse(path.read_text(encoding="utf-8"))
        for node in ast.walk(tree):
            if isinstance(node, ast.Attribute) and node.attr in fields:
                assert ast.unparse(node.value).endswith("faults"), (rel, ast.unparse(node))
                users.setdefault(rel, set()).add(node.attr)
            elif isinstance(node, ast.Constant) and isinstance(node.value, str) and node.value in fields:
                raise AssertionError(f"{rel} spells the fault {node.value!r} as a string")
    assert users == {"engine/serve/prefill.py": {"prefill_hold_s", "prefill_corrupt_marker"},
                     "engine/serve/decode.py": {"decode_link_error"}}, users
