"""`specctl export sglang` / `specctl import sglang`: shapes, full flag names, and the round trip
import(export(d)) validating to the same findings as d (presets and random valid deployments)."""

from __future__ import annotations

import json
import tempfile
from pathlib import Path
from typing import Any

import pytest
import yaml
from hypothesis import HealthCheck, assume, given, settings
from sglang_strategies import deployments
from validate_helpers import run_cli, run_json

from specctl.schemas.adaptive import AdaptiveConfig, Knobs, parse_deployment_adaptive, parse_sglang_config
from specctl.schemas.deployment import load_deployment
from specctl.schemas.sglang.export import export_commands, shell_script
from specctl.schemas.sglang.flags import table

PRESETS = ["tiny-pd", "tiny-colocated", "sglang-default-adaptive", "llama-3.1-8b-pd"]


@pytest.fixture(autouse=True)
def _offline(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("TRANSFORMERS_OFFLINE", "1")


def _buckets(cfg: AdaptiveConfig) -> list[tuple[int, tuple[int, ...], Knobs]]:
    return [(b.min_batch_size, b.candidate_steps, b.knobs) for b in cfg.buckets]  # where it was read aside


def _flags(argv: list[str]) -> list[str]:
    return [a for a in argv[3:] if a.startswith("--")]


@pytest.mark.parametrize("preset", PRESETS)
def test_export_uses_full_flag_names_and_adaptive_always_carries_the_switch(preset: str) -> None:
    deployment = load_deployment(preset)
    cmds = export_commands(deployment)
    tab = table()
    for role, argv in (("prefill", cmds.prefill), ("decode", cmds.decode), ("colocated", cmds.colocated)):
        if not argv:
            continue
        assert argv[:3] == ["python", "-m", "sglang.launch_server"]
        for flag in _flags(argv):
            assert tab.by_option[flag].name == flag, flag  # canonical, never an alias or a prefix
        if "--speculative-adaptive-config" in argv:
            assert "--speculative-adaptive" in argv
            name = argv[argv.index("--speculative-adaptive-config") + 1]
            # the file it references is exported, and SGLang reads from it the deployment's very buckets
            exported, findings = parse_sglang_config(json.loads(cmds.files[name]))
            asked, _ = parse_deployment_adaptive(deployment.role(role).speculative.adaptive)
            assert exported is not None and asked is not None
            assert [f for f in findings if f.severity == "error"] == []
            assert _buckets(exported) == _buckets(asked) and exported.strategy == asked.strategy
        assert not any(a.startswith("builtin:") for a in argv)  # never a name SGLang could look up on a hub


def test_export_json_shape() -> None:
    result = run_cli("export", "sglang", "-c", "llama-3.1-8b-pd", "--format", "json")
    assert result.exit_code == 0, result.output
    doc = json.loads(result.stdout)
    assert set(doc) == {"prefill", "decode", "router", "files"}
    assert doc["router"][:3] == ["smg", "launch", "--pd-disaggregation"]  # the default router
    assert "--pd-disaggregation" in doc["router"]
    assert doc["prefill"][doc["prefill"].index("--disaggregation-mode") + 1] == "prefill"
    assert set(doc["files"]) == {"adaptive.json"}


def _findings(doc: dict[str, Any]) -> list[tuple[str, str, str]]:
    return sorted((f["code"], f["severity"], f["path"]) for x in doc["files"] for f in x["findings"])


def _roundtrip(data: dict[str, Any], tmp: Path, *, property_test: bool = False) -> None:
    src = tmp / "d.yaml"
    src.write_text(yaml.safe_dump(data, sort_keys=False))
    code0, doc0 = run_json("--no-table", str(src))
    valid = code0 in (0, 1) and not any(f["severity"] == "error" for f in doc0["files"][0]["findings"])
    if property_test:
        assume(valid)
    assert valid, doc0
    out = tmp / "out"
    result = run_cli("export", "sglang", "-c", str(src), "--out", str(out))
    assert result.exit_code == 0, result.output
    # the exported commands validate like the deployment: the same codes and severities (paths are flags there,
    # and a finding on a setting both roles share is reported in each command file)
    code1, doc1 = run_json("--no-table", str(out / "prefill.sh"), str(out / "decode.sh"))
    # except that SGLang cannot load specctl's builtin models (Transformers knows no model_type specctl_*):
    # the exported commands of a builtin-model deployment carry that start-up error on --model-path
    builtin = {(f["code"], f["severity"], f["path"]) for x in doc1["files"] for f in x["findings"]
               if f["code"] == "SGL300" and "specctl builtin model" in f["message"]}
    assert bool(builtin) == any(str(v).startswith("builtin:") for v in (data.get("model") or {}).values())
    for x in doc1["files"]:
        x["findings"] = [f for f in x["findings"] if (f["code"], f["severity"], f["path"]) not in builtin]
    assert code1 == (code0 if not builtin or any(f["severity"] == "error" for x in doc1["files"]
                                                  for f in x["findings"]) else 1)
    assert {(c, s) for c, s, _ in _findings(doc1)} == {(c, s) for c, s, _ in _findings(doc0)}
    # and importing them gives a deployment with exactly the deployment's findings
    back = tmp / "back.yaml"
    result = run_cli("import", "sglang", str(out / "prefill.sh"), str(out / "decode.sh"), "-o", str(back))
    assert result.exit_code == 0, result.output
    code2, doc2 = run_json("--no-table", str(back))
    assert (code2, _findings(doc2)) == (code0, _findings(doc0))


@pytest.mark.parametrize("preset", ["tiny-pd", "llama-3.1-8b-pd"])
def test_import_of_export_of_preset_has_the_same_findings(preset: str, tmp_path: Path) -> None:
    from specctl import presets

    _roundtrip(yaml.safe_load(presets.read_text(preset)), tmp_path)


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture,
                                                                  HealthCheck.filter_too_much])
@given(data=deployments())
def test_import_of_export_has_the_same_findings(data: dict[str, Any]) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        _roundtrip(data, Path(tmp), property_test=True)


def test_shell_script_is_one_command_that_validate_reads_back(tmp_path: Path) -> None:
    cmds = export_commands(load_deployment("tiny-pd"))
    assert cmds.decode is not None
    (tmp_path / "decode.sh").write_text(shell_script(cmds.decode))
    for name, text in cmds.files.items():
        (tmp_path / name).write_text(text)
    from specctl.schemas.sglang.command import parse_command_text

    cmd = parse_command_text((tmp_path / "decode.sh").read_text(), name=str(tmp_path / "decode.sh"))
    assert cmd.recognised and cmd.findings == []
    assert cmd.value("speculative_adaptive") is True and cmd.role == "decode"


def test_import_refuses_commands_it_cannot_read(tmp_path: Path) -> None:
    (tmp_path / "p.sh").write_text("python -m sglang.launch_server --model-path /m --disaggregation-mode prefill "
                                   "--page-sise 16\n")
    (tmp_path / "d.sh").write_text("python -m sglang.launch_server --model-path /m --disaggregation-mode decode\n")
    result = run_cli("import", "sglang", str(tmp_path / "p.sh"), str(tmp_path / "d.sh"))
    assert result.exit_code == 1
    assert "SGL001" in result.stderr and "--page-size" in result.stderr


def test_import_needs_one_prefill_and_one_decode(tmp_path: Path) -> None:
    for n in ("a", "b"):
        (tmp_path / f"{n}.sh").write_text("python -m sglang.launch_server --model-path /m "
                                          "--disaggregation-mode prefill\n")
    result = run_cli("import", "sglang", str(tmp_path / "a.sh"), str(tmp_path / "b.sh"))
    assert result.exit_code == 2 and "one prefill and one decode" in result.stderr


def test_import_of_one_server_is_a_colocated_deployment(tmp_path: Path) -> None:
    (tmp_path / "s.sh").write_text("sglang serve --model-path /models/x --port 31301 --page-size 32 "
                                   "--cuda-graph-max-bs-decode 16 --max-running-requests 16\n")
    result = run_cli("import", "sglang", str(tmp_path / "s.sh"))
    assert result.exit_code == 0, result.output
    data = yaml.safe_load(result.stdout)
    assert data["roles"] == {"colocated": {"host": "127.0.0.1", "port": 31301}}
    assert data["cache"]["page_size"] == 32 and data["serve"]["graph_batch_sizes"] == [1, 2, 4, 8, 12, 16]


def test_import_says_which_flags_the_deployment_cannot_hold(tmp_path: Path) -> None:
    base = "python -m sglang.launch_server --model-path /models/x --page-size 16 --tp-size 2 "
    (tmp_path / "p.sh").write_text(base + "--disaggregation-mode prefill --kv-cache-dtype fp8_e4m3\n")
    (tmp_path / "d.sh").write_text(base + "--disaggregation-mode decode --port 31302 --disable-radix-cache\n")
    result = run_cli("import", "sglang", str(tmp_path / "p.sh"), str(tmp_path / "d.sh"))
    assert result.exit_code == 0, result.output
    assert "prefill: not represented in the deployment (kept as a comment): --tp-size 2 --kv-cache-dtype fp8_e4m3" \
        in result.stderr
    assert "# decode: SGLang flags with no field in a deployment (pass them yourself): --tp-size 2" in result.stdout
    assert "--disable-radix-cache" not in result.stdout  # implied by the export of a decode role
