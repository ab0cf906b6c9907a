"""SGLang launch commands through `specctl validate`: folders of example command files drive the tests.

tests/data/sglang/invalid/*.sh: one command each, its `# expect:` header lists exactly the (code, path)
findings (path = the SGLang flag). tests/data/sglang/pairs/NAME/{prefill,decode}.sh: a PD pair, the
expectations in decode.sh (pair findings land on decode). tests/data/sglang/valid/*.sh and pairs/ok:
clean. Every SGL code has a failing example, and `specctl explain` knows it.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from validate_helpers import DATA, data_copy, expectations, run_cli, run_json

SGL = DATA / "sglang"
INVALID = sorted((SGL / "invalid").glob("*.sh"))
VALID = sorted((SGL / "valid").glob("*.sh"))
PAIRS = sorted(p for p in (SGL / "pairs").iterdir() if p.is_dir() and p.name != "ok")


@pytest.fixture(scope="module")
def data_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return data_copy(tmp_path_factory.mktemp("sglang"))


@pytest.fixture(autouse=True)
def _in_data_dir(monkeypatch: pytest.MonkeyPatch, data_root: Path) -> None:
    # --model-path is relative to the working directory (as for SGLang); adaptive/config files to the command file
    monkeypatch.chdir(data_root)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("TRANSFORMERS_OFFLINE", "1")


def _got(findings: list[dict], expect: list[tuple[str, str]]) -> list[tuple[str, str]]:
    listed = {c for c, _ in expect}
    return sorted((f["code"], f["path"]) for f in findings if f["severity"] != "info" or f["code"] in listed)


@pytest.mark.parametrize("path", INVALID, ids=lambda p: p.name)
def test_invalid_command_reports_exactly_the_expected_findings(path: Path) -> None:
    _, expect = expectations(path)
    assert expect, f"{path.name} declares no expectation"
    code, doc = run_json("--no-table", str(path.relative_to(DATA)))
    (file,) = doc["files"]
    assert _got(file["findings"], expect) == sorted(expect)
    for f in file["findings"]:
        assert f["message"] and f["fix"] and f["line"] is not None, f
    errors = any(f["severity"] == "error" for f in file["findings"])
    assert code == (1 if errors else 0)


@pytest.mark.parametrize("path", VALID, ids=lambda p: p.name)
def test_valid_command_is_clean(path: Path) -> None:
    code, doc = run_json("--strict", "--no-table", str(path.relative_to(DATA)))
    assert [f for f in doc["files"][0]["findings"] if f["severity"] != "info"] == []
    assert code == 0


@pytest.mark.parametrize("pair", PAIRS, ids=lambda p: p.name)
def test_pair_reports_each_disagreement_on_the_decode_flag(pair: Path) -> None:
    _, expect = expectations(pair / "decode.sh")
    code, doc = run_json("--no-table", str((pair / "prefill.sh").relative_to(DATA)),
                         str((pair / "decode.sh").relative_to(DATA)))
    prefill, decode = doc["files"]
    assert [f for f in prefill["findings"] if f["severity"] != "info"] == []
    assert _got(decode["findings"], expect) == sorted(expect)
    text = {f["code"]: f["message"] for f in decode["findings"]}
    for c, _ in expect:
        if c.startswith("SGL2") and "never fails" not in text[c]:  # says when SGLang would have failed
            assert "SGLang fails at" in text[c], text[c]
    assert code == 1


def test_good_pair_is_clean_and_shows_the_reachable_table() -> None:
    code, doc = run_json("--strict", "sglang/pairs/ok/prefill.sh", "sglang/pairs/ok/decode.sh")
    assert code == 0 and doc["ok"] is True
    table = doc["files"][1]["reachable"]
    assert table is not None and table["required_states"] == [0, 1, 3, 5] and table["initial_steps"] == 3


def test_every_sglang_code_has_a_failing_example_and_an_explanation() -> None:
    from specctl.schemas.catalog import all_rules

    codes = [c for c in all_rules() if c.startswith("SGL")]
    failing = {c for p in INVALID for c, _ in expectations(p)[1]}
    failing |= {c for p in PAIRS for c, _ in expectations(p / "decode.sh")[1]}
    # SGL005 (another installed SGLang version) is tested in test_sglang_command.py; SGL9xx (SGLang's own
    # verdicts, validate --resolve) need SGLang itself and are tested where it runs
    assert sorted(c for c in set(codes) - failing - {"SGL005"} if not c.startswith("SGL9")) == []
    for c in codes:
        result = run_cli("explain", c)
        assert result.exit_code == 0 and c in result.stdout and "Prevents at runtime" in result.stdout


def test_findings_point_at_the_line_of_the_flag() -> None:
    _, doc = run_json("--no-table", "sglang/invalid/sgl003-wrong-values.sh")
    by_path = {f["path"]: f for f in doc["files"][0]["findings"]}
    assert by_path["--page-size"]["line"] == 3 and "invalid int value: 'sixteen'" in by_path["--page-size"]["message"]
    assert "invalid choice: 'bf16'" in by_path["--dtype"]["message"]
    assert "expected one argument" in by_path["--port"]["message"]


def test_one_bad_file_never_hides_the_others() -> None:
    code, doc = run_json("--no-table", "sglang/invalid/sgl000-unbalanced-quote.sh", "sglang/valid/sgl-adaptive.sh",
                         "sglang/invalid/sgl001-unknown-flag.sh")
    assert [f["ok"] for f in doc["files"]] == [False, True, False]
    assert code == 1


def test_validating_sglang_commands_never_imports_torch_or_sglang(data_root: Path) -> None:
    import os
    import subprocess
    import sys

    code = (
        "import sys\n"
        "from specctl.cli.main import app\n"
        "try:\n"
        "    app(['validate', 'sglang/pairs/ok/prefill.sh', 'sglang/pairs/ok/decode.sh', '--format', 'json'])\n"
        "except SystemExit as e:\n"
        "    assert e.code == 0, e.code\n"
        "bad = sorted(m for m in sys.modules if m.split('.')[0] in ('torch', 'sglang', 'transformers'))\n"
        "print('HEAVY', bad, file=sys.stderr)\n"
    )
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, cwd=data_root,
                         env=env)
    assert out.returncode == 0, out.stderr
    assert "HEAVY []" in out.stderr


def test_values_sglang_sizes_at_run_time_trigger_no_rule(tmp_path: Path) -> None:
    # no --max-total-tokens / --max-running-requests: SGLang sizes them from GPU memory, specctl cannot know
    (tmp_path / "a.json").write_text('{"1": {"candidate_steps": [1, 3]}, "256": {"candidate_steps": [0, 1]}}')
    (tmp_path / "s.sh").write_text("python -m sglang.launch_server --model-path /models/x --page-size 3 "
                                   "--speculative-algorithm EAGLE --speculative-draft-model-path /models/d "
                                   "--speculative-adaptive --speculative-adaptive-config a.json\n")
    code, doc = run_json("--strict", "--no-table", str(tmp_path / "s.sh"))
    assert [f["code"] for f in doc["files"][0]["findings"] if f["severity"] != "info"] == []
    assert code == 0
