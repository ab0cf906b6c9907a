"""Reading one SGLang launch command: shell words, launchers, --config, flag errors, version note."""

from __future__ import annotations

from pathlib import Path

import pytest

from specctl.schemas.sglang.command import looks_like_command, parse_command_text, shell_words


@pytest.fixture(autouse=True)
def _offline(monkeypatch: pytest.MonkeyPatch) -> None:
    # no hub, ever: local directories only
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("TRANSFORMERS_OFFLINE", "1")


def _cmd(text: str, tmp: Path | None = None):  # noqa: ANN202 - test helper
    name = str((tmp or Path("/nonexistent")) / "cmd.sh")
    return parse_command_text(text, name=name, base_dir=tmp or Path("/nonexistent"))


def _codes(cmd) -> list[tuple[str, str]]:  # noqa: ANN001
    return [(f.code, f.path) for f in cmd.findings]


def test_shell_words_handle_quotes_escapes_continuations_and_comments() -> None:
    text = "A=1 python -m x \\\n  --a 'b c' \"d \\\"e\\\"\" f\\ g # comment 'unbalanced\n"
    (words,) = shell_words(text)
    assert [w.text for w in words] == ["A=1", "python", "-m", "x", "--a", "b c", 'd "e"', "f g"]
    assert [w.line for w in words][-4:] == [2, 2, 2, 2]
    # a later pipeline stage (`| tee log`) is not a second command
    assert [[w.text for w in c] for c in shell_words("a; b && c | d\ne")] == [["a"], ["b"], ["c"], ["e"]]


@pytest.mark.parametrize("launcher", [
    "python -m sglang.launch_server", "python3 -m sglang.launch_server",
    "/usr/bin/python3.11 -u -m sglang.launch_server",
    "sglang serve", "CUDA_VISIBLE_DEVICES=0,1 HF_HUB_OFFLINE=1 python -m sglang.launch_server",
    "env A=1 exec python3 -m sglang.launch_server", "python -m sglang serve",
])
def test_launchers_are_recognised(launcher: str) -> None:
    cmd = _cmd(f"{launcher} --model-path /m --page-size 16\n")
    assert cmd.recognised and cmd.findings == []
    assert cmd.value("page_size") == 16 and cmd.value("model_path") == "/m"


def test_env_assignments_and_export_lines_are_the_environment() -> None:
    cmd = _cmd("#!/bin/sh\nexport HF_HUB_OFFLINE=1\nX=2\nCUDA_VISIBLE_DEVICES=3 python -m sglang.launch_server "
               "--model-path /m\n")
    assert cmd.findings == [] and cmd.env == {"HF_HUB_OFFLINE": "1", "X": "2", "CUDA_VISIBLE_DEVICES": "3"}
    assert cmd.first_line == 4


def test_every_flag_error_at_once_with_argparse_wording() -> None:
    cmd = _cmd("python -m sglang.launch_server --model-path /m --page-size x --dtype bf --tp-size 2.5 "
               "--disable-radix-cache=1 --speculative-num-stepz 3 --speculative-algo EAGLE stray --port\n")
    assert _codes(cmd) == [
        ("SGL003", "--page-size"), ("SGL003", "--dtype"), ("SGL003", "--tp-size"), ("SGL003", "--disable-radix-cache"),
        ("SGL001", "--speculative-num-stepz"), ("SGL002", "--speculative-algorithm"), ("SGL003", "$"),
        ("SGL003", "--port"),
    ]
    msgs = [f.message for f in cmd.findings]
    assert "argument --page-size: invalid int value: 'x'" in msgs[0]
    assert "did you mean --speculative-num-steps?" in cmd.findings[4].fix
    assert cmd.value("speculative_algorithm") == "EAGLE"  # an abbreviation still reads its value


def test_ambiguous_prefix_is_an_error_naming_the_candidates() -> None:
    cmd = _cmd("python -m sglang.launch_server --model-path /m --speculative-draft 3\n")
    (f,) = cmd.findings
    assert f.code == "SGL001" and "ambiguous" in f.message and "--speculative-draft-model-path" in f.message


def test_bad_files_are_findings_never_exceptions() -> None:
    assert _codes(_cmd("")) == [("SGL000", "$")]
    assert _codes(_cmd("python -m sglang.launch_server --model-path '/m\n")) == [("SGL000", "$")]
    assert _codes(_cmd("vllm serve /m\n")) == [("SGL000", "$")]
    two = _cmd("python -m sglang.launch_server --model-path /m\npython -m sglang.launch_server --model-path /n\n")
    assert _codes(two) == [("SGL000", "$")] and two.findings[0].line == 2
    assert _codes(_cmd("python -m sglang.launch_server --port 1\n")) == [("SGL003", "--model-path")]


def test_config_yaml_is_read_relative_to_the_command_file_and_the_command_line_wins(tmp_path: Path) -> None:
    (tmp_path / "c.yaml").write_text("page-size: 32\ndtype: bfloat16\ndisable-radix-cache: true\n"
                                     "cuda-graph-bs-decode: [1, 2, 4]\n")
    cmd = _cmd("python -m sglang.launch_server --model-path /m --config c.yaml --page-size 64\n", tmp_path)
    assert cmd.findings == []
    assert cmd.value("page_size") == 64 and cmd.value("dtype") == "bfloat16"
    assert cmd.value("disable_radix_cache") is True and cmd.value("cuda_graph_bs_decode") == [1, 2, 4]
    assert cmd.options["dtype"].from_config == str(tmp_path / "c.yaml")


def test_config_keys_are_flags_as_sglang_merges_them(tmp_path: Path) -> None:
    # SGLang turns each key into `--KEY` as written: underscores are not flag spellings, switches that are
    # not store_true cannot be set, `--config=FILE` is never merged, a nested config is never read
    (tmp_path / "c.yaml").write_text("tp_size: 2\nenable-tf32-matmul: true\nconfig: c.yaml\npage-s: 8\n")
    cmd = _cmd("python -m sglang.launch_server --model-path /m --config c.yaml\n", tmp_path)
    got = {(f.code, f.path, f.severity) for f in cmd.findings}
    assert got == {("SGL001", "--tp_size", "error"), ("SGL004", "--enable-tf32-matmul", "error"),
                   ("SGL004", "--config", "warning"), ("SGL002", "--page-size", "warning")}
    assert any("in --config c.yaml" in f.message and "did you mean --tp-size" in f.fix for f in cmd.findings)
    assert cmd.value("page_size") == 8
    eq = _cmd("python -m sglang.launch_server --model-path /m --config=c.yaml\n", tmp_path)
    assert [(f.code, f.severity) for f in eq.findings] == [("SGL004", "warning")] and eq.value("tp_size") == 1
    (tmp_path / "empty.yaml").write_text("# nothing\n")
    assert _cmd("python -m sglang.launch_server --model-path /m --config empty.yaml\n", tmp_path).findings == []


def test_config_problems(tmp_path: Path) -> None:
    (tmp_path / "loop.yaml").write_text("config: loop.yaml\n")
    (tmp_path / "bad.yaml").write_text("page-sise: 3\n")
    (tmp_path / "c.json").write_text("{}")
    for arg, code in [("loop.yaml", "SGL004"), ("nope.yaml", "SGL004"), ("c.json", "SGL004"), ("bad.yaml", "SGL001")]:
        # (loop.yaml: a warning: SGLang never reads a config named inside a config)
        cmd = _cmd(f"python -m sglang.launch_server --model-path /m --config {arg}\n", tmp_path)
        assert [f.code for f in cmd.findings] == [code], (arg, cmd.findings)
    twice = _cmd("python -m sglang.launch_server --model-path /m --config c.json --config nope.yaml\n", tmp_path)
    assert "Multiple config files" in twice.findings[0].message


def test_looks_like_command() -> None:
    assert looks_like_command("#!/bin/bash\nexec foo\n")
    assert looks_like_command("# prefill\npython -m sglang.launch_server --model-path /m \\\n  --port 1\n")
    assert not looks_like_command("version: 1\nmodel: {target: x}\n")
    assert not looks_like_command('{"1": {"candidate_steps": [1]}}')
    assert not looks_like_command("# a comment\n- a\n- b\n")


def test_installed_version_the_history_lacks_is_noted(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    import sys

    from specctl.schemas.sglang import command, release
    from specctl.schemas.sglang.flags import newest

    (tmp_path / "sglang-9.9.9.dist-info").mkdir()
    monkeypatch.setattr(sys, "path", [str(tmp_path), *sys.path])
    release.installed_sglang_version.cache_clear()
    try:
        choice = release.choose_release(None, None)
    finally:
        release.installed_sglang_version.cache_clear()
    assert choice.release == newest() and not choice.named
    cmd = _cmd("python -m sglang.launch_server --model-path /m\n")
    command.release_note(cmd, choice.note)
    (f,) = cmd.findings
    assert f.code == "SGL005" and f.severity == "info" and "9.9.9" in f.message and newest() in f.message


def test_launch_scripts_as_people_write_them() -> None:
    text = ("#!/bin/bash\nset -euo pipefail\nulimit -n 65536\nexport HF_HUB_OFFLINE=1\n"
            "nohup python3 -m sglang.launch_server --model-path /m --page-size 16 --served-model-name 'a;b' \\\n"
            "  > prefill.log 2>&1 &\nwait\n")
    cmd = _cmd(text)
    assert cmd.recognised and cmd.findings == []
    assert cmd.value("page_size") == 16 and cmd.value("served_model_name") == "a;b"  # a quoted ; is a word
    piped = _cmd("python -m sglang.launch_server --model-path /m 2>&1 | tee log.txt\n")
    assert piped.findings == [] and piped.value("model_path") == "/m"
    cd = _cmd("cd /srv && python -m sglang.launch_server --model-path /m\n")
    assert [(f.code, f.severity) for f in cd.findings] == [("SGL000", "info")]
    two = _cmd("python train.py --epochs 3\npython -m sglang.launch_server --model-path /m\n")
    assert [(f.code, f.severity) for f in two.findings] == [("SGL000", "error")]
