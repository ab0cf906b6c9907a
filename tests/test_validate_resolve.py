"""`specctl validate --resolve [--gpu G] [--sglang-python PATH]`: SGLang's own start-up verdicts as findings.

The end-to-end test runs SGLang's real resolution (schemas/sglang/resolve_child.py) in child processes; the
failure tests use real interpreters that cannot load SGLang, exit at once or hang, and require a finding
(SGL902), never a traceback or a hung validate.
"""

from __future__ import annotations

import importlib.util
import json
import os
import stat
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from specctl.cli.main import app
from specctl.schemas.sglang.verdicts import ResolveRequest, Target, pair_findings, resolve_findings

ROOT = Path(__file__).resolve().parents[1]
MODELS = ROOT / "tests" / "data" / "models"
HAS_SGLANG = importlib.util.find_spec("sglang") is not None


def _script(tmp_path: Path, name: str, body: str) -> str:
    p = tmp_path / name
    p.write_text("#!/bin/sh\n" + body + "\n")
    p.chmod(p.stat().st_mode | stat.S_IEXEC)
    return str(p)


def _cmd(tmp_path: Path, name: str, text: str) -> str:
    p = tmp_path / name
    p.write_text(text)
    return str(p)


def _codes(report: dict, file: str) -> list[tuple[str, str]]:
    f = next(f for f in report["files"] if f["path"].endswith(file))
    return [(x["code"], x["message"]) for x in f["findings"] if x["code"].startswith("SGL9")]


@pytest.mark.slow
@pytest.mark.timeout(900)
@pytest.mark.skipif(not HAS_SGLANG, reason="SGLang is not installed (scripts/setup.sh installs it)")
def test_resolve_reports_sglangs_verdicts_and_the_pairs_differences(tmp_path, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    q = MODELS / "qwen3-next"
    prefill = _cmd(tmp_path, "prefill.sh", f"python -m sglang.launch_server --model-path {q} --tp-size 4 "
                   "--disaggregation-mode prefill --disaggregation-transfer-backend mooncake --port 30001\n")
    decode = _cmd(tmp_path, "decode.sh", f"python -m sglang.launch_server --model-path {q} --tp-size 4 "
                  "--disaggregation-mode decode --disaggregation-transfer-backend mooncake --port 30002 "
                  "--page-size 64\n")
    bad = _cmd(tmp_path, "bad.sh", f"python -m sglang.launch_server --model-path {MODELS / 'llama'} "
               f"--speculative-algorithm EAGLE --speculative-draft-model-path {MODELS / 'llama-draft'} "
               "--speculative-draft-window-size 0\n")
    res = CliRunner().invoke(app, ["validate", "--resolve", "--gpu", "B200", "--format", "json", prefill, decode,
                                   bad])
    assert res.exit_code == 1, res.output
    report = json.loads(res.output)
    assert [c for c, _ in _codes(report, "prefill.sh")] == ["SGL900"]
    assert "SGLang 0.5.23's own start-up resolution (B200) accepts the prefill command" in \
        _codes(report, "prefill.sh")[0][1]
    decode_codes = dict(_codes(report, "decode.sh"))
    assert "page_size: prefill 1, decode 64" in decode_codes["SGL903"]
    bad_codes = _codes(report, "bad.sh")
    assert bad_codes[0][0] == "SGL901"
    assert "--speculative-draft-window-size must be positive, got 0." in bad_codes[0][1]
    assert "speculative_hook.py" in bad_codes[0][1]


@pytest.mark.slow
@pytest.mark.timeout(900)
@pytest.mark.skipif(not HAS_SGLANG, reason="SGLang is not installed (scripts/setup.sh installs it)")
def test_a_case_that_outlives_its_time_is_a_finding():
    t = Target(name="x.sh", role="colocated", argv=["--model-path", str(MODELS / "llama")])
    [[f]] = resolve_findings([t], ResolveRequest(gpu="H100", python=sys.executable, case_timeout=0.001))
    assert f.code == "SGL902" and "Timeout" in f.message


def test_an_interpreter_without_sglang_is_a_finding(tmp_path):
    # the real interpreter, isolated from every site-packages: torch and SGLang cannot be imported
    py = _script(tmp_path, "python", f'exec "{sys.executable}" -I -S "$@"')
    cmd = _cmd(tmp_path, "server.sh", f"python -m sglang.launch_server --model-path {MODELS / 'llama'}\n")
    res = CliRunner().invoke(app, ["validate", "--resolve", "--sglang-python", py, "--format", "json", cmd])
    assert res.exit_code == 0, res.output  # a warning: the check was not made, the command is not wrong
    [(code, msg)] = _codes(json.loads(res.output), "server.sh")
    assert code == "SGL902" and "cannot be loaded" in msg and "ModuleNotFoundError" in msg


def test_an_interpreter_that_dies_or_hangs_is_a_finding(tmp_path):
    t = Target(name="x.sh", role="colocated", argv=["--model-path", str(MODELS / "llama")])
    dies = _script(tmp_path, "dies", "exit 7")
    [[f]] = resolve_findings([t], ResolveRequest(python=dies))
    assert f.code == "SGL902" and "did not load" in f.message
    hangs = _script(tmp_path, "hangs", "exec sleep 60")
    [[f]] = resolve_findings([t], ResolveRequest(python=hangs, start_timeout=0.5))
    assert f.code == "SGL902" and "did not load within 0.5 s" in f.message
    missing = str(tmp_path / "no-such-python")
    [[f]] = resolve_findings([t], ResolveRequest(python=missing))
    assert f.code == "SGL902" and "cannot start" in f.message


def test_no_interpreter_with_sglang_is_a_finding_that_says_how(monkeypatch):
    import specctl.schemas.sglang.verdicts as verdicts

    monkeypatch.setattr(verdicts, "has_sglang", lambda python=None: False)  # this interpreter, as if bare
    t = Target(name="x.sh", role="colocated", argv=["--model-path", "m"])
    [[f]] = resolve_findings([t], ResolveRequest())
    assert f.code == "SGL902" and "--sglang-python" in f.fix


def test_pair_findings_name_every_shared_difference_and_the_backends():
    p = {"page_size": 1, "speculative_algorithm": "EAGLE", "tp_size": 4, "attn_dp_size": 1,
         "attention_backend": "fa3"}
    d = {"page_size": 64, "speculative_algorithm": "EAGLE", "tp_size": 4, "attn_dp_size": 2,
         "attention_backend": "flashinfer"}
    found = {f.code: f.message for f in pair_findings(p, d)}
    assert "page_size: prefill 1, decode 64" in found["SGL903"]
    assert "attention TP (tp_size / attn_dp_size): prefill 4, decode 2" in found["SGL903"]
    assert "attention_backend: prefill 'fa3', decode 'flashinfer'" in found["SGL904"]
    assert pair_findings(p, p) == []


@pytest.mark.parametrize("argv", [["--gpu", "A100"], ["--sglang-python", "/x"], ["--resolve", "--gpu", "A100"]])
def test_resolve_options_misused_are_usage_errors(tmp_path, argv):
    cmd = _cmd(tmp_path, "server.sh", f"python -m sglang.launch_server --model-path {MODELS / 'llama'}\n")
    res = CliRunner().invoke(app, ["validate", *argv, cmd])
    assert res.exit_code == 2
    assert "--resolve" in res.output or "H100" in res.output


def test_the_gpu_alone_picks_the_predicted_start_up_choices(tmp_path):
    """--gpu without --resolve: SGLang's choices are predicted for that GPU (Hopper fa3, Blackwell trtllm_mha with
    its page size), and reported in the file's `sglang` block."""
    cmd = _cmd(tmp_path, "server.sh", f"python -m sglang.launch_server --model-path {MODELS / 'llama'}\n")
    seen = {}
    for gpu in ("H100", "B200"):
        res = CliRunner().invoke(app, ["validate", "--gpu", gpu, "--format", "json", "--no-table", cmd])
        assert res.exit_code == 0, res.output
        seen[gpu] = json.loads(res.stdout)["files"][0]["sglang"]
    assert seen["H100"]["gpu"] == "H100" and seen["H100"]["resolved"]["attention_backend"] == "fa3"
    assert seen["B200"]["resolved"] == {"attention_backend": "trtllm_mha", "page_size": 64}


def test_the_sglang_codes_are_explained():
    for code in ("SGL900", "SGL901", "SGL902", "SGL903", "SGL904"):
        res = CliRunner().invoke(app, ["explain", code])
        assert res.exit_code == 0 and code in res.output


def test_the_child_is_shipped_as_a_script_and_never_imported():
    from specctl.schemas.sglang import resolver

    assert resolver.CHILD.is_file() and resolver.CHILD.name == "resolve_child.py"
    src = "\n".join(p.read_text() for p in (ROOT / "schemas").rglob("*.py") if p.name != "resolve_child.py")
    assert "import resolve_child" not in src and "resolve_child import" not in src
    assert os.access(resolver.CHILD, os.R_OK)


def test_an_sglang_deployment_is_resolved_as_the_validator_read_it(tmp_path):
    """`--resolve` on an `engine: sglang` deployment resolves the commands exported from the document the
    validator checked (overrides applied): an interpreter that dies is the deployment's SGL902, and a
    deployment with error findings is reported by its findings alone, never as an internal error."""
    dep = tmp_path / "dep.yaml"
    dep.write_text((ROOT / "tests" / "data" / "valid" / "sch004-engine-sglang.yaml").read_text())
    dies = _script(tmp_path, "dies", "exit 7")
    args = ["validate", "--resolve", "--sglang-python", dies, "--format", "json", "--set", "serve.max_batch_size=4"]
    res = CliRunner().invoke(app, [*args, str(dep)])
    assert res.exit_code == 0, res.output
    [(code, msg)] = _codes(json.loads(res.output), "dep.yaml")
    assert code == "SGL902" and "did not load" in msg
    res = CliRunner().invoke(app, [*args, "--set", "cache.page_size=0", str(dep)])
    assert res.exit_code == 1, res.output
    codes = [f["code"] for f in json.loads(res.output)["files"][0]["findings"]]
    assert "SCH000" not in codes and not [c for c in codes if c.startswith("SGL9")], codes
