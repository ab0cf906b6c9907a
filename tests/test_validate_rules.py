"""Folders of example files drive the rule tests: every rule has a failing example in data/invalid/
(its header names the exact (code, JSON path) findings expected, nothing more) and a passing one in
data/valid/ (no errors or warnings, and never the rule's code)."""

from __future__ import annotations

from pathlib import Path

import pytest
from validate_helpers import DATA, data_copy, expectations, run_json

INVALID = sorted(p for p in (DATA / "invalid").iterdir() if p.suffix in (".yaml", ".json"))
VALID = sorted(p for p in (DATA / "valid").iterdir() if p.suffix in (".yaml", ".json"))


@pytest.fixture(scope="module")
def data_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return data_copy(tmp_path_factory.mktemp("validate"))


@pytest.fixture(autouse=True)
def _in_data_dir(monkeypatch: pytest.MonkeyPatch, data_root: Path) -> None:
    # Example files name test models by paths relative to the data folder (model paths are cwd-relative).
    monkeypatch.chdir(data_root)


def _findings(doc: dict) -> list[dict]:
    assert len(doc["files"]) == 1
    return doc["files"][0]["findings"]


@pytest.mark.parametrize("path", INVALID, ids=lambda p: p.name)
def test_invalid_example_reports_exactly_the_expected_findings(path: Path) -> None:
    args, expect = expectations(path)
    assert expect, f"{path.name} declares no expectation"
    code, doc = run_json(str(path.relative_to(DATA)), "--no-table", *args)
    found = _findings(doc)
    listed_infos = {c for c, _ in expect}
    got = sorted((f["code"], f["path"]) for f in found if f["severity"] != "info" or f["code"] in listed_infos)
    assert got == sorted(expect)
    for f in found:
        assert f["message"] and f["fix"], f
        assert f["line"] is not None, f  # every finding of a file points at a line
    severities = {f["severity"] for f in found}
    expected_exit = 2 if any(c == "SCH000" for c, _ in expect) else (1 if "error" in severities else 0)
    assert code == expected_exit
    assert doc["ok"] is (expected_exit == 0)


@pytest.mark.parametrize("path", VALID, ids=lambda p: p.name)
def test_valid_example_is_clean(path: Path) -> None:
    args, _ = expectations(path)
    code, doc = run_json("--strict", str(path.relative_to(DATA)), *args)
    found = _findings(doc)
    assert [f for f in found if f["severity"] != "info"] == []
    rule = path.name.split("-")[0].upper()
    assert rule not in {f["code"] for f in found}
    assert code == 0 and doc["ok"] is True


def test_every_code_of_mine_has_a_failing_and_a_passing_example() -> None:
    from specctl.schemas.catalog import all_rules
    from specctl.schemas.sglang.drafts import SGLANG_ONLY

    # SGL and SGLang-only draft codes: tests/test_sglang_rules.py, tests/test_sglang_families.py
    mine = [c for c in all_rules() if not c.startswith(("ADP", "SGL")) and c not in SGLANG_ONLY]
    failing = {c for p in INVALID for c, _ in expectations(p)[1]}
    passing = {p.name.split("-")[0].upper() for p in VALID}
    assert sorted(set(mine) - failing) == []
    # The info-only and load-failure codes have no "clean" counterpart beyond other valid files.
    assert sorted(set(mine) - passing - {"SCH000", "PD511"}) == []


def test_pair_of_files_reports_each_disagreement_once_on_the_decode_file() -> None:
    pair = DATA / "pairs" / "state-types-differ"
    _, expect = expectations(pair / "decode.yaml")
    code, doc = run_json("pairs/state-types-differ/prefill.yaml", "pairs/state-types-differ/decode.yaml")
    assert code == 1
    prefill, decode = doc["files"]
    assert prefill["findings"] == [] and prefill["ok"] is True
    got = sorted((f["code"], f["path"]) for f in decode["findings"])
    assert got == sorted(expect)
    by_code = {f["code"]: f for f in decode["findings"]}
    # each message names both values
    assert "[mamba, swa]" in by_code["PD505"]["message"] and "[swa]" in by_code["PD505"]["message"]
    assert "float32" in by_code["PD502"]["message"] and "bfloat16" in by_code["PD502"]["message"]
    assert by_code["PD505"]["line"] == 5


def test_pair_that_agrees_is_clean() -> None:
    code, doc = run_json("--strict", "pairs/ok/prefill.yaml", "pairs/ok/decode.yaml")
    assert code == 0, doc
    assert all(f["findings"] == [] for f in doc["files"])


def test_lone_side_of_a_pair_is_an_info() -> None:
    code, doc = run_json("pairs/ok/decode.yaml")
    assert code == 0
    assert [(f["code"], f["severity"]) for f in _findings(doc)] == [("PD511", "info")]


def _pair_files(tmp_path: Path, prefill_host: str, decode_host: str) -> tuple[str, str]:
    head = ("version: 1\nmodel: {target: builtin:tiny-hybrid, dtype: float32}\n"
            "speculative: {algorithm: draft, draft: builtin:tiny-draft, num_steps: 3}\n"
            "cache: {page_size: 16}\ntransfer: {backend: zmq}\nroles:\n")
    p, d = tmp_path / "prefill.yaml", tmp_path / "decode.yaml"
    p.write_text(head + f"  prefill: {{host: '{prefill_host}', port: 30001, bootstrap_port: 8998}}\n")
    d.write_text(head + f"  decode: {{host: '{decode_host}', port: 30001}}\n")
    return str(p), str(d)


@pytest.mark.parametrize(("prefill_host", "decode_host", "expect"), [
    ("0.0.0.0", "0.0.0.0", ("TOP606", "info")),    # a wildcard bind names no machine: started on their own hosts
    ("127.0.0.1", "localhost", ("TOP601", "error")),  # loopback on both sides is one machine
    ("10.0.0.1", "10.0.0.1", ("TOP601", "error")),  # the same literal address is one machine
    ("${P_HOST}", "10.0.0.1", ("TOP606", "info")),  # an unexpanded variable cannot be compared
    ("10.0.0.1", "10.0.0.2", None),
])
def test_two_files_collide_only_on_one_machine(tmp_path: Path, prefill_host: str, decode_host: str,
                                              expect: tuple[str, str] | None) -> None:
    _, doc = run_json(*_pair_files(tmp_path, prefill_host, decode_host))
    got = [(f["code"], f["severity"]) for f in doc["files"][1]["findings"] if f["code"].startswith("TOP")]
    assert got == ([expect] if expect else [])


def test_two_sglang_commands_on_wildcard_hosts_are_not_a_collision(tmp_path: Path) -> None:
    model = DATA / "models" / "llama"
    for role in ("prefill", "decode"):
        (tmp_path / f"{role}.sh").write_text(
            f"python -m sglang.launch_server --model-path {model} --disaggregation-mode {role} "
            "--disaggregation-transfer-backend mooncake --host 0.0.0.0 --port 30000\n")
    _, doc = run_json(str(tmp_path / "prefill.sh"), str(tmp_path / "decode.sh"))
    codes = [(f["code"], f["severity"]) for file in doc["files"] for f in file["findings"]]
    assert ("TOP606", "info") in codes and not [c for c, s in codes if c == "TOP601"]
    for role in ("prefill", "decode"):
        text = (tmp_path / f"{role}.sh").read_text().replace("0.0.0.0", "127.0.0.1")
        (tmp_path / f"{role}.sh").write_text(text)
    _, doc = run_json(str(tmp_path / "prefill.sh"), str(tmp_path / "decode.sh"))
    assert "TOP601" in [f["code"] for file in doc["files"] for f in file["findings"]]
