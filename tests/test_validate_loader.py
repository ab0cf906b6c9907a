"""Bad input gets a clear message and exit 2, never a traceback; every JSON path has a line."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest
from validate_helpers import run_cli, run_json

from specctl.errors import UsageError
from specctl.schemas.loader import MAX_BYTES, load_document, parse_document

BOMB = 'a: &a ["lol","lol","lol","lol","lol","lol","lol","lol","lol"]\n' + "".join(
    f"{chr(98 + i)}: &{chr(98 + i)} [" + ",".join(["*" + chr(97 + i)] * 9) + "]\n" for i in range(8)
)

BAD_TEXT = {
    "syntax": ("version: 1\nmodel:\n  target: x\n   dtype: y\n", "YAML syntax error"),
    "empty": ("", "empty"),
    "only-comments": ("# nothing\n", "empty"),
    "top-level-array": ('[{"1": {"candidate_steps": [1]}}]', "top level is a list"),
    "top-level-scalar": ("42\n", "expected a mapping"),
    "alias-bomb": (BOMB, "alias"),
    "deep-nesting": ("a: " + "[" * 500 + "]" * 500 + "\n", "nesting deeper"),
    "deeper-than-libyaml": ("a: " + "[" * 5000 + "\n", "nesting"),
    "huge-int": ("version: " + "9" * 5000 + "\n", "too large"),
    "int-over-64-bits": ("version: 99999999999999999999\n", "too large"),
    "nan": ("model: {target: x}\nserve: {max_batch_size: .nan}\n", "not a finite number"),
    "json-nan": ('{"1": {"candidate_steps": [1]}, "ema_alpha": NaN}', "not a finite number"),
    "inf": ('{"ema_alpha": -Infinity}', "not a finite number"),
    "bool-key": ("on: 1\n", "boolean"),
    "null-key": ("~: 1\n", "null"),
    "float-key": ("1.5: {candidate_steps: [1]}\n", "float"),
    "list-key": ("? [1, 2]\n: x\n", "must be a string"),
    "two-documents": ("version: 1\n---\nversion: 1\n", "more than one YAML document"),
    "python-tag": ("a: !!python/object:os.system {}\n", "unsupported YAML tag"),
    "binary-tag": ("a: !!binary aGk=\n", "unsupported YAML tag"),
}


@pytest.mark.parametrize("name", sorted(BAD_TEXT))
def test_bad_text_is_a_usage_error_with_a_clear_message(tmp_path: Path, name: str) -> None:
    text, needle = BAD_TEXT[name]
    path = tmp_path / f"{name}.yaml"
    path.write_text(text)
    t0 = time.monotonic()
    with pytest.raises(UsageError) as exc:
        load_document(path)
    assert time.monotonic() - t0 < 5  # bounded (the alias bomb expands to 387M nodes if unbounded)
    assert needle in str(exc.value)
    assert str(path) in str(exc.value)
    code, doc = run_json(str(path))
    assert code == 2
    [finding] = doc["files"][0]["findings"]
    assert finding["code"] == "SCH000" and finding["path"] == "$" and needle in finding["message"]


def test_syntax_error_reports_line_and_column(tmp_path: Path) -> None:
    path = tmp_path / "d.yaml"
    path.write_text(BAD_TEXT["syntax"][0])
    result = run_cli("validate", str(path))
    assert result.exit_code == 2
    assert result.stdout.startswith(f"{path}:4: SCH000 $: error: YAML syntax error")
    assert "Traceback" not in result.stdout + result.stderr


def test_unreadable_inputs_exit_2(tmp_path: Path) -> None:
    big = tmp_path / "big.yaml"
    big.write_text("# pad\n" * (10 * 1024 * 1024 // 6))
    assert big.stat().st_size > MAX_BYTES
    latin1 = tmp_path / "latin1.yaml"
    latin1.write_bytes(b"version: 1\nname: caf\xe9\n")
    cases = {
        str(tmp_path / "missing.yaml"): "no such file",
        str(tmp_path): "is a directory",
        str(big): "larger than",
        str(latin1): "not UTF-8",
    }
    if os.geteuid() != 0:
        locked = tmp_path / "locked.yaml"
        locked.write_text("version: 1\n")
        locked.chmod(0)
        cases[str(locked)] = "permission denied"
    for path, needle in cases.items():
        code, doc = run_json(path)
        assert code == 2, path
        [finding] = doc["files"][0]["findings"]
        assert needle in finding["message"], (path, finding)


def test_one_unreadable_file_among_good_ones_still_reports_all(tmp_path: Path) -> None:
    code, doc = run_json("tiny-pd", str(tmp_path / "missing.yaml"), "tiny-colocated")
    assert code == 2
    assert [f["ok"] for f in doc["files"]] == [True, False, True]


def test_every_json_path_has_a_position() -> None:
    doc = parse_document(
        "version: 1\nspeculative:\n  adaptive:\n    buckets:\n      8: {candidate_steps: [0, 1]}\n", name="x"
    )
    assert doc.data["speculative"]["adaptive"]["buckets"] == {"8": {"candidate_steps": [0, 1]}}
    assert doc.positions["$.speculative.adaptive.buckets.8"] == (5, 7)
    assert doc.positions["$.speculative.adaptive.buckets.8.candidate_steps.1"] == (5, 32)
    # paths not in the file resolve to their nearest ancestor
    assert doc.position("$.speculative.adaptive.buckets.8.ema_alpha") == (5, 7)


def test_yaml_int_keys_become_strings_and_merge_keys_work() -> None:
    doc = parse_document("base: &b {x: 1, y: 2}\nc:\n  <<: *b\n  y: 3\n0x10: a\n", name="x")
    assert doc.data == {"base": {"x": 1, "y": 2}, "c": {"x": 1, "y": 3}, "16": "a"}


def test_duplicate_keys_are_findings_not_crashes() -> None:
    doc = parse_document("a: 1\na: 2\n", name="x")
    assert doc.data == {"a": 2}
    assert doc.duplicates == (("$.a", 2, 1),)


def test_json_with_tabs_parses() -> None:
    doc = parse_document('{\n\t"1": {"candidate_steps": [1, 3]},\n\t"ema_alpha": 0.3\n}', name="x.json")
    assert doc.data == {"1": {"candidate_steps": [1, 3]}, "ema_alpha": 0.3}
    assert doc.positions["$.ema_alpha"] == (3, 2)
