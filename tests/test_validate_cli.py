"""The validate/schema/presets/explain commands through Typer's runner (fixed width), output parsed."""

from __future__ import annotations

import io
import json
from pathlib import Path

import pytest
from validate_helpers import DATA, run_cli, run_json

from specctl.schemas.validator import Validator

SGLANG_DEFAULT = DATA / "valid" / "adp101-sglang-default.json"


def test_every_preset_validates_clean() -> None:
    from specctl import presets

    names = presets.names()
    assert {"tiny-colocated", "tiny-pd", "sglang-default-adaptive", "llama-3.1-8b-pd"} <= set(names)
    code, doc = run_json("--strict", *names)
    assert code == 0, doc
    for f in doc["files"]:
        assert [x for x in f["findings"] if x["severity"] != "info"] == [], f
        assert f["reachable"]["rows"], f["path"]
    llama = next(f for f in doc["files"] if f["path"].endswith("llama-3.1-8b-pd.yaml"))
    assert {x["code"] for x in llama["findings"]} == {"MOD701"}  # model paths live on the serving host


def test_sglang_default_with_initial_steps_2_names_the_candidates_and_the_fix() -> None:
    result = run_cli("validate", str(SGLANG_DEFAULT), "--initial-steps", "2", "--graph-batch-sizes", "1,2,4,8")
    assert result.exit_code == 1
    first, fix = result.stdout.splitlines()[:2]
    assert first.startswith(f"{SGLANG_DEFAULT}:1: ADP101 $: error: --speculative-num-steps=2")
    assert "[0, 1, 3, 5, 7]" in first
    assert fix.startswith("    fix: ") and "[0, 1, 3, 5, 7]" in fix
    assert "reachable steps" in result.stdout and "prebuilt runtime states" in result.stdout


def test_json_output_has_the_design_shape_and_the_reachable_table() -> None:
    code, doc = run_json(str(SGLANG_DEFAULT), "--initial-steps", "3", "--graph-batch-sizes", "1,2,4,8")
    assert code == 0
    assert set(doc) == {"ok", "files"} and doc["ok"] is True
    [f] = doc["files"]
    assert set(f) == {"path", "ok", "findings", "reachable"}
    reach = f["reachable"]
    assert reach["required_states"] == [0, 1, 3, 5, 7] and reach["initial_steps"] == 3
    rows = {(r["batch_min"], r["batch_max"]): r for r in reach["rows"]}
    assert rows[(5, 8)]["padded_size"] == 8 and rows[(5, 8)]["bucket"] == 8
    assert rows[(3, 4)]["steps"] == [1, 3, 5, 7]


def test_text_lines_are_file_line_code_path_message_then_fix(tmp_path: Path) -> None:
    p = tmp_path / "d.yaml"
    p.write_text("version: 1\nmodel:\n  target: builtin:tiny-hybrid\n  dtyp: float32\ncache: {page_size: 0}\n")
    result = run_cli("validate", str(p))
    assert result.exit_code == 1
    lines = result.stdout.splitlines()
    assert lines[0] == f"{p}:4: SCH001 $.model.dtyp: error: unknown key 'dtyp' in model"
    assert lines[1].startswith("    fix: did you mean 'dtype'?")
    assert lines[2].startswith(f"{p}:5: SCH004 $.cache.page_size: error: cache.page_size is 0")
    assert lines[-1] == "1 file checked: 1 of 1 failed (2 errors, 0 warnings, 0 info)"
    assert "\x1b[" not in result.stdout  # plain when not a terminal


def test_strict_makes_warnings_fail() -> None:
    warn = DATA / "invalid" / "fbk402-batch-above-graphs.yaml"
    assert run_cli("validate", str(warn)).exit_code == 0
    code, doc = run_json("--strict", str(warn))
    assert code == 1 and doc["ok"] is False and doc["files"][0]["ok"] is False


def test_usage_errors_exit_2_without_traceback() -> None:
    for args in (["validate", "tiny-pd", "--graph-batch-sizes", "1,x"], ["validate", "tiny-pd", "--kind", "nope"],
                 ["explain", "NOPE999"], ["presets", "show", "nope"], ["explain"]):
        result = run_cli(*args)
        assert result.exit_code == 2, args
        assert "Traceback" not in result.stdout + result.stderr
        assert "error" in result.stderr.lower()


def test_kind_sglang_forces_sglang_parsing() -> None:
    code, doc = run_json("--kind", "sglang", "tiny-colocated")
    assert code == 1  # a deployment is not a bucket table: every key is an unknown knob or not an integer
    assert all(f["code"].startswith("ADP") for f in doc["files"][0]["findings"])


def test_schema_command_prints_a_valid_2020_12_schema() -> None:
    from jsonschema import Draft202012Validator

    result = run_cli("schema")
    assert result.exit_code == 0
    schema = json.loads(result.stdout)
    Draft202012Validator.check_schema(schema)
    assert schema["$schema"] == "https://json-schema.org/draft/2020-12/schema"

    def closed(node: object, where: str) -> None:
        if isinstance(node, dict):
            if node.get("type") == "object" or node.get("type") == ["object", "null"]:
                assert node.get("additionalProperties") is False, where
            if "properties" in node:
                for k, v in node["properties"].items():
                    if "$ref" not in v:
                        assert v.get("description") or "properties" in v, f"{where}.{k} lacks a description"
            for k, v in node.items():
                closed(v, f"{where}.{k}")
        elif isinstance(node, list):
            for i, v in enumerate(node):
                closed(v, f"{where}[{i}]")

    closed(schema, "$")


def test_presets_list_and_show() -> None:
    result = run_cli("presets", "list")
    assert result.exit_code == 0 and "tiny-pd" in result.stdout and "Prefill/decode" in result.stdout
    result = run_cli("presets", "list", "--format", "json")
    assert {p["name"] for p in json.loads(result.stdout)} >= {"tiny-pd", "tiny-colocated"}
    result = run_cli("presets", "show", "tiny-pd")
    assert result.exit_code == 0 and "name: tiny-pd" in result.stdout
    import yaml

    assert yaml.safe_load(result.stdout)["roles"]["prefill"]["bootstrap_port"] == 8998


def test_explain_every_code_and_list() -> None:
    from specctl.schemas.catalog import all_rules

    rules = all_rules()
    listed = run_cli("explain", "--list").stdout.splitlines()
    assert [ln.split()[0] for ln in listed] == list(rules)
    for doc in rules.values():  # every rule has the long form explain prints
        assert doc.title and doc.summary and doc.runtime_error and doc.fix, doc.code
        assert doc.severity in ("error", "warning", "info")
    for code in ("SCH001", "CAP301", "FBK401", "MOD702", "PD509", "TOP601", "ADP101"):
        result = run_cli("explain", code.lower())
        assert result.exit_code == 0, code
        assert result.stdout.startswith(f"{code} (")
        assert "Prevents at runtime:" in result.stdout and "Fix:" in result.stdout
    doc = json.loads(run_cli("explain", "PD505", "--format", "json").stdout)
    assert "state component count mismatch" in doc["runtime_error"]
    result = run_cli("explain", "PD55")
    assert "did you mean" in result.stderr


def test_rich_reporter_carries_the_same_lines() -> None:
    from specctl.schemas.report import render_plain, write_text

    report = Validator().validate_paths([DATA / "invalid" / "pd505-state-types-differ.yaml"])
    out = io.StringIO()
    write_text(report, out, rich=True, width=300)
    plain = render_plain(report)
    assert [ln.rstrip() for ln in out.getvalue().splitlines()] == [ln.rstrip() for ln in plain.splitlines()]


@pytest.mark.parametrize("n", [1, 12])
def test_many_files_one_invocation(tmp_path: Path, n: int) -> None:
    from specctl import presets

    paths = []
    for i in range(n):
        p = tmp_path / f"d{i}.yaml"
        p.write_text(presets.read_text("tiny-pd"))
        paths.append(str(p))
    result = run_cli("validate", *paths)
    assert result.exit_code == 0
    # tables are shown by default for a few files only
    assert ("reachable steps" in result.stdout) is (n <= 10)


def test_validate_never_imports_torch() -> None:
    import subprocess
    import sys

    code = (
        "import sys\n"
        "from specctl.cli.main import app\n"
        "try:\n"
        "    app(['validate', 'tiny-pd', 'sglang-default-adaptive', '--format', 'json'])\n"
        "except SystemExit as e:\n"
        "    assert e.code == 0, e.code\n"
        "bad = sorted(m for m in sys.modules if m == 'torch' or m.startswith('torch.'))\n"
        "print('HEAVY', bad, file=sys.stderr)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert "HEAVY []" in out.stderr
