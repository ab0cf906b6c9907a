"""CLI habits users expect: text with [brackets] arrives intact (on a terminal and piped), piped output is
not hard-wrapped, `--version`, Typer's shell completion, `--format json` on `presets show`.

Real subprocesses of `python -m specctl.cli`; the terminal case runs the CLI on a real pseudo-terminal.
"""

from __future__ import annotations

import fcntl
import json
import os
import pty
import re
import shlex
import struct
import subprocess
import sys
import termios

import pytest
import yaml

ENV = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "NO_COLOR": ""}
ENV.pop("NO_COLOR")
ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]|\x1b\][^\x07]*\x07")
BAD_SET = ["--set", "cache.state_types=[swa]"]
# Every command whose error path the issue saw lose its brackets (the seed error names [swa] and [mamba, swa]).
ERROR_PATHS = {
    "generate": ["generate", "-c", "tiny-colocated", "--prompt", "x", *BAD_SET],
    "serve": ["serve", "--role", "colocated", "-c", "tiny-colocated", "--set", "roles.colocated.port=33210",
              *BAD_SET],
    "bench": ["bench", "-c", "tiny-colocated", "--set", "roles.colocated.port=33211", "--no-progress", *BAD_SET],
    "up": ["up", "-c", "tiny-pd", "--set", "roles.router.port=33200", "--set", "roles.prefill.port=33201",
           "--set", "roles.decode.port=33202", "--set", "roles.prefill.bootstrap_port=33203", *BAD_SET],
}


def cli(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "specctl.cli", *args], capture_output=True, text=True, timeout=120,
                          env=env or ENV)


def on_terminal(*args: str, columns: int = 200) -> tuple[int, str]:
    """Run the CLI with stdout and stderr on a pseudo-terminal `columns` wide; (exit code, text without ANSI)."""
    master, slave = pty.openpty()
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 50, columns, 0, 0))
    env = {k: v for k, v in ENV.items() if k not in ("COLUMNS", "LINES")}
    proc = subprocess.Popen([sys.executable, "-m", "specctl.cli", *args], stdin=subprocess.DEVNULL, stdout=slave,
                            stderr=slave, env=env, close_fds=True)
    os.close(slave)
    chunks = []
    while True:
        try:
            data = os.read(master, 65536)
        except OSError:  # EIO: the child closed the terminal
            break
        if not data:
            break
        chunks.append(data)
    os.close(master)
    code = proc.wait(timeout=120)
    return code, ANSI.sub("", b"".join(chunks).decode(errors="replace")).replace("\r\n", "\n")


@pytest.mark.parametrize("name", sorted(ERROR_PATHS))
def test_bracketed_values_survive_every_error_path_piped_and_unwrapped(name: str) -> None:
    res = cli(*ERROR_PATHS[name])
    assert res.returncode == 1, res.stderr
    assert "Traceback" not in res.stderr
    line = next(x for x in res.stderr.splitlines() if x.startswith("error:"))
    # one line (no hard wrap at 80 columns), with the very values the error is about
    assert "cache.state_types is [swa] but" in line and "layers give [mamba, swa]" in line
    assert len(line) > 80
    hint = next(x for x in res.stderr.splitlines() if x.startswith("hint:"))
    assert "set it to [mamba, swa]" in hint


@pytest.mark.parametrize("name", sorted(ERROR_PATHS))
def test_bracketed_values_survive_every_error_path_on_a_terminal(name: str) -> None:
    code, text = on_terminal(*ERROR_PATHS[name])
    assert code == 1, text
    flat = " ".join(text.split())
    assert "cache.state_types is [swa] but" in flat and "layers give [mamba, swa]" in flat
    assert "set it to [mamba, swa]" in flat and "Traceback" not in flat


@pytest.mark.parametrize(("args", "expected"), [
    (["explain", "[X1]"], "unknown code '[X1]'"),
    (["presets", "show", "[nope]"], "unknown preset '[nope]'"),
    (["validate", "/nonexistent/[dir]/d.yaml"], "/nonexistent/[dir]/d.yaml"),
])
def test_bracketed_user_input_is_echoed_intact(args: list[str], expected: str) -> None:
    res = cli(*args)
    assert res.returncode == 2 and expected in res.stdout + res.stderr, res  # usage / unreadable input


def test_fail_prints_markup_like_text_literally(capsys: pytest.CaptureFixture[str]) -> None:
    from specctl.cli.common import fail
    from specctl.errors import UsageError

    message = "value [bold]x[/bold] and [red] and \\[escaped] and [/] stay"
    exit_ = fail(UsageError(message, hint="try [mamba, swa]"))
    err = capsys.readouterr().err
    assert f"error: {message}" in err and "hint: try [mamba, swa]" in err
    assert exit_.exit_code == 2


def test_version_flag_and_command() -> None:
    from specctl import __version__

    res = cli("--version")
    assert res.returncode == 0 and res.stdout.strip() == f"specctl {__version__}"
    assert cli("version").stdout.strip() == __version__


def test_typer_shell_completion_for_bash_zsh_fish() -> None:
    helps = cli("--help").stdout
    assert "--install-completion" in helps and "--show-completion" in helps
    # --show-completion prints the script for the shell it runs under (shellingham reads the process's
    # ancestors): run it under bash, since a detached test run may have no shell among its ancestors
    res = subprocess.run(["bash", "-c", f"{shlex.quote(sys.executable)} -m specctl.cli --show-completion; exit $?"],
                         capture_output=True, text=True, timeout=120, env=ENV)
    assert res.returncode == 0 and "_SPECCTL_COMPLETE" in res.stdout and "specctl" in res.stdout, res
    # the completion protocol of each shell: "specctl val" -> validate, "specctl presets sh" -> show
    env = {**ENV, "_SPECCTL_COMPLETE": "complete_bash", "COMP_WORDS": "specctl val", "COMP_CWORD": "1"}
    assert cli(env=env).stdout.split() == ["validate"]
    env = {**ENV, "_SPECCTL_COMPLETE": "complete_zsh", "_TYPER_COMPLETE_ARGS": "specctl presets sh"}
    assert '"show"' in cli(env=env).stdout
    env = {**ENV, "_SPECCTL_COMPLETE": "complete_fish", "_TYPER_COMPLETE_ARGS": "specctl be",
           "_TYPER_COMPLETE_FISH_ACTION": "get-args"}
    assert cli(env=env).stdout.startswith("bench\t")


def test_presets_show_json() -> None:
    res = cli("presets", "show", "tiny-pd", "--format", "json")
    assert res.returncode == 0, res.stderr
    doc = json.loads(res.stdout)
    assert doc["name"] == "tiny-pd" and doc["description"]
    text = cli("presets", "show", "tiny-pd").stdout
    assert doc["yaml"] == text and doc["deployment"] == json.loads(json.dumps(yaml.safe_load(text)))
    bad = cli("presets", "show", "[nope]", "--format", "json")
    assert bad.returncode == 2 and "unknown preset '[nope]'" in bad.stderr
