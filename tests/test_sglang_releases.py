"""SGLang launch commands checked against the flags of the release the user runs (the shipped flag
history, generated from every release's own parser by scripts/gen_sglang_flags.py).

tests/data/sglang/releases/*.sh: one command per release difference (a flag split, renamed, removed,
added later; a choice removed), each with `# release X: CODE PATH SEVERITY; ...` (or `clean`) lines:
exactly the warnings and errors `specctl validate --sglang-version X` reports. The history's view of
the installed SGLang is compared with that release's real parser in a child process (`--check`).
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from validate_helpers import DATA, data_copy, run_cli, run_json

from specctl.schemas.sglang import flags
from specctl.schemas.sglang.release import choose_release, python_sglang_version

ROOT = Path(__file__).resolve().parent.parent
EXAMPLES = sorted((DATA / "sglang" / "releases").glob("*.sh"))


@pytest.fixture(scope="module")
def data_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return data_copy(tmp_path_factory.mktemp("sglang-releases"))


@pytest.fixture(autouse=True)
def _in_data_dir(monkeypatch: pytest.MonkeyPatch, data_root: Path) -> None:
    monkeypatch.chdir(data_root)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("TRANSFORMERS_OFFLINE", "1")


def _per_release(path: Path) -> dict[str, list[tuple[str, str, str]]]:
    out: dict[str, list[tuple[str, str, str]]] = {}
    for line in path.read_text().splitlines():
        line = line.lstrip("# ").strip()
        if not line.startswith("release "):
            continue
        head, _, rest = line.partition(":")
        items = [] if rest.strip() == "clean" else [tuple(i.split()) for i in rest.split(";")]
        out[head.split()[1]] = sorted(items)  # type: ignore[arg-type]
    return out


def _cases() -> list[tuple[Path, str]]:
    return [(p, rel) for p in EXAMPLES for rel in _per_release(p)]


@pytest.mark.parametrize(("path", "release"), _cases(), ids=lambda x: x.name if isinstance(x, Path) else x)
def test_each_release_difference_is_reported_for_the_release_named(path: Path, release: str) -> None:
    expect = _per_release(path)[release]
    assert release in flags.releases(), f"{release} is not in the shipped history"
    code, doc = run_json("--no-table", "--sglang-version", release, str(path.relative_to(DATA)))
    (file,) = doc["files"]
    got = sorted((f["code"], f["path"], f["severity"]) for f in file["findings"] if f["severity"] != "info")
    assert got == expect
    for f in file["findings"]:
        if f["code"] in ("SGL006", "SGL007"):
            assert f"SGLang {release}" in f["message"]  # names the release checked
            assert "$." not in f["message"] + f["fix"]  # SGLang's dialect: flags, not schema fields
    assert code == (1 if any(s == "error" for _, _, s in expect) else 0)


def test_the_examples_cover_every_kind_of_difference() -> None:
    found = set()
    for path in EXAMPLES:
        for release in _per_release(path):
            code, doc = run_json("--no-table", "--sglang-version", release, str(path.relative_to(DATA)))
            for f in doc["files"][0]["findings"]:
                if f["code"] == "SGL006":
                    where = flags.elsewhere(f["path"], release)
                    assert where is not None
                    found.add(where.how)
            found |= {"choice" for f in doc["files"][0]["findings"] if f["code"] == "SGL007"}
    assert {"split", "renamed", "removed", "added_later", "choice"} <= found, found


def test_split_message_names_the_new_flags_and_the_releases() -> None:
    code, doc = run_json("--no-table", "--sglang-version", "0.5.23", "sglang/releases/cuda-graph-bs-split.sh")
    by_path = {f["path"]: f for f in doc["files"][0]["findings"]}
    msg = by_path["--cuda-graph-max-bs"]["message"]
    assert "split into --cuda-graph-max-bs-decode/--cuda-graph-max-bs-prefill" in msg
    assert "SGLang 0.5.23 does not declare it" in msg and "ambiguous abbreviation" in msg
    assert "--cuda-graph-max-bs-decode" in by_path["--cuda-graph-max-bs"]["fix"]


def test_inferred_release_makes_other_releases_flags_warnings(tmp_path: Path) -> None:
    """No --sglang-version: the release of sglang.python's SGLang (found by its dist-info, no import)."""
    venv = tmp_path / "venv"
    (venv / "bin").mkdir(parents=True)
    (venv / "lib" / "python3.11" / "site-packages" / "sglang-0.5.23.dist-info").mkdir(parents=True)
    python = venv / "bin" / "python"
    python.write_text("#!/bin/sh\nexit 1\n")
    python.chmod(0o755)
    assert python_sglang_version(str(python)) == "0.5.23"
    code, doc = run_json("--no-table", "--set", f"sglang.python={python}", "sglang/releases/cuda-graph-bs-split.sh")
    sev = {f["path"]: f["severity"] for f in doc["files"][0]["findings"] if f["code"] == "SGL006"}
    assert sev == {"--cuda-graph-bs": "warning", "--cuda-graph-max-bs": "warning"}
    assert code == 0
    old = tmp_path / "old" / "lib" / "python3.11" / "site-packages" / "sglang-0.5.13.dist-info"
    old.mkdir(parents=True)
    (tmp_path / "old" / "bin").mkdir()
    (tmp_path / "old" / "bin" / "python").symlink_to(python)
    choice = choose_release(None, str(tmp_path / "old" / "bin" / "python"))
    assert (choice.release, choice.named) == ("0.5.13", False) and "sglang.python" in choice.source


def test_a_python_with_no_sglang_falls_back_to_the_installed_or_newest(tmp_path: Path) -> None:
    """The child that asks an interpreter for its sys.path runs for real: this one has no SGLang there."""
    python = tmp_path / "bin" / "python"
    python.parent.mkdir()
    python.write_text(f"#!/bin/sh\nexec {sys.executable} -S \"$@\"\n")
    python.chmod(0o755)
    assert python_sglang_version(str(python)) is None
    choice = choose_release(None, str(python))
    assert choice.release in flags.releases() and not choice.named


def test_prefix_resolution_follows_the_release() -> None:
    old, new = flags.table("0.5.13"), flags.table("0.5.23")
    assert old.lookup("--cuda-graph-max-bs") == (old.by_option["--cuda-graph-max-bs"], "exact")
    assert new.lookup("--cuda-graph-max-bs") is None
    assert new.ambiguous("--cuda-graph-max-bs") == ["--cuda-graph-max-bs-decode", "--cuda-graph-max-bs-prefill"]


def test_versions_the_history_lacks_and_bad_versions() -> None:
    pick = flags.pick_release("0.5.99")
    assert pick is not None and pick.release == flags.newest() and not pick.exact
    assert flags.pick_release("0.5.23") == flags.Pick("0.5.23", True)
    code, doc = run_json("--no-table", "--sglang-version", "0.5.99", "sglang/valid/sgl-plain.sh")
    notes = [f for f in doc["files"][0]["findings"] if f["code"] == "SGL005"]
    assert code == 0 and len(notes) == 1 and "0.5.99" in notes[0]["message"] and flags.newest() in notes[0]["message"]
    for bad in ("fresh", "0.1.0"):
        result = run_cli("validate", "--sglang-version", bad, "sglang/valid/sgl-plain.sh")
        assert result.exit_code == 2 and "--sglang-version" in result.output


def test_list_sglang_versions_text_and_json() -> None:
    result = run_cli("validate", "--list-sglang-versions", "--sglang-version", "0.5.16")
    assert result.exit_code == 0
    lines = result.stdout.splitlines()
    assert any(ln.split()[:1] == ["0.5.16"] and "<- checked" in ln for ln in lines)
    assert all(any(ln.split()[:1] == [r] for ln in lines) for r in flags.releases())
    result = run_cli("validate", "--list-sglang-versions", "--format", "json")
    doc = json.loads(result.stdout)
    assert [r["version"] for r in doc["releases"]] == list(flags.releases())
    assert doc["newest"] == flags.newest() and doc["checked"]["release"] in flags.releases()
    assert all(r["flags"] == len(flags.table(r["version"]).flags) for r in doc["releases"])
    assert run_cli("validate").exit_code == 2  # no files, no --list-sglang-versions: usage error


def test_dynamo_worker_flags_are_skipped_with_their_values() -> None:
    code, doc = run_json("--no-table", "sglang/invalid/sgl008-dynamo-worker.sh")
    (file,) = doc["files"]
    info = [f for f in file["findings"] if f["code"] == "SGL008"]
    assert len(info) == 1
    for name in ("--endpoint", "--dyn-tool-call-parser", "--connector", "--router-mode"):
        assert name in info[0]["message"]
    # their values are not read as SGLang arguments ('unexpected argument kvbm' ...), SGLang's are checked
    assert [(f["code"], f["path"]) for f in file["findings"] if f["severity"] != "info"] == [("SGL003", "--page-size")]
    assert code == 1


def test_dynamo_and_sglang_serve_are_sglang_commands(tmp_path: Path) -> None:
    from specctl.schemas.sglang.command import parse_command_text

    for text in ("python3 -m dynamo.sglang --model-path /m --endpoint=dyn://a.b.c --dyn-reasoning-parser r1 "
                 "--page-size 16\n",
                 "sglang serve --model-path /m --page-size 16\n", "python -m sglang serve --model-path /m "
                 "--page-size 16\n"):
        cmd = parse_command_text(text, name="c.sh", base_dir=tmp_path)
        assert cmd.recognised and cmd.value("page_size") == 16, text
        assert [f.code for f in cmd.findings if f.severity != "info"] == [], (text, cmd.findings)


def test_the_history_maps_the_known_moves() -> None:
    moves = {(m["from"], m["how"]): m for m in flags.history()["moves"]}
    split = moves[("--cuda-graph-max-bs", "split")]
    assert split["to"] == ["--cuda-graph-max-bs-decode", "--cuda-graph-max-bs-prefill"]
    assert moves[("--mamba-scheduler-strategy", "renamed")]["to"] == ["--mamba-radix-cache-strategy"]
    for option in ("--keep-mm-feature-on-device", "--mamba-scheduler-strategy", "--cuda-graph-bs",
                   "--cuda-graph-max-bs"):
        where = flags.elsewhere(option, flags.newest())
        assert where is not None and where.releases, option


def test_history_round_trips_every_release() -> None:
    """build_history(tables) then release_json(v) gives each table back (the format is lossless)."""
    data = flags.history()
    tables = {v: flags.release_json(v, data) for v in data["releases"]}
    again = flags.build_history(tables, data["not_loaded"], generator=data["generator"])
    assert again == data


@pytest.mark.slow
@pytest.mark.skipif(importlib.util.find_spec("sglang") is None,
                    reason="sglang is not installed (scripts/setup.sh installs it --no-deps)")
def test_history_view_equals_the_installed_sglang_parser() -> None:
    """The generator's --check: the installed SGLang's own parser (a child process) equals its view."""
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
    proc = subprocess.run([sys.executable, str(ROOT / "scripts" / "gen_sglang_flags.py"), "--check"],
                          capture_output=True, text=True, timeout=400, env=env)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "up to date" in proc.stdout
