"""One SGLang launch command read from a file: shell words with their lines, then SGLang's flags.

Contract: `parse_command_text(text, name=..., base_dir=...)` returns an `SGLangCommand` and never
raises for bad content: every problem is a `Finding` (SGL0xx) pointing at the file's line and, where
there is one, at the flag (the finding's path is the flag's full name, e.g. `--page-size`).
Accepted: `python[3[.N]] [-u ...] -m sglang.launch_server ARGS`, `sglang serve ARGS`, `python -m sglang
serve ARGS`, and NVIDIA Dynamo's SGLang worker `python -m dynamo.sglang ARGS` (SGLang's flags plus
Dynamo's own, `dynamo_flags.json`, which are skipped with their values and named in one SGL008 info), leading
`VAR=value` assignments (and `env`, `exec`, `nohup`), `\\` continuations, `#` comments, single/double
quotes, redirections and `| tee ...` (dropped), `export VAR=value` and harmless setup lines (`set -e`,
`ulimit` ...); any other second command is an SGL000 error.
`--config FILE` (SGLang's YAML of flag values; command-line flags win) is read relative to the
command file's directory with the loader's caps. Flags are checked against the table of one SGLang
release (`parse_command_text(..., release=, release_named=)`; default the history's newest, `flags.py`)
like argparse would, but all at once: unknown (with the closest name), abbreviated (SGLang accepts
unique prefixes: a warning naming the full flag), missing or wrong values, choices. A flag or choice
the release lacks but another release declares is SGL006/SGL007 (with the rename or split), an error
when the user named the release, a warning when it was inferred. Every message names flags, never
deployment-schema fields, and names the release checked where the verdict depends on it.

`looks_like_command(text)` (from `sniff`) tells a shell command file from a YAML/JSON document.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import re
from dataclasses import dataclass, field, replace
from importlib import resources
from pathlib import Path
from typing import Any

from specctl.errors import UsageError
from specctl.schemas.catalog import RuleDoc, register
from specctl.schemas.findings import Finding
from specctl.schemas.loader import child_path, parse_document, read_text
from specctl.schemas.sglang.flags import Flag, FlagTable, choice_elsewhere, convert, elsewhere, ranges, successor, table
from specctl.schemas.sglang.sniff import looks_like_command  # noqa: F401 - re-exported for callers

_ASSIGN = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*=")
_PYTHON = re.compile(r"^(?:.*/)?python(?:3(?:\.\d+)?)?$")
_NUMBER = re.compile(r"^-\d+$|^-\d*\.\d+$")
# Shell statements a launch script may hold besides the launch itself: they start no server.
HARMLESS = frozenset({"set", "ulimit", "umask", "echo", "printf", "unset", "true", ":", "shopt", "trap", "wait",
                      "sleep", "mkdir", "nvidia-smi"})
PATH_CHANGING = frozenset({"cd", "pushd", "source", "."})

_SGL = "SGLang's server exits at start-up with an argparse usage error"
for _code, _title, _sev, _summary, _runtime, _fix, _before, _after in (
    ("SGL000", "not one SGLang launch command", "error",
     "A command file must hold exactly one SGLang launch command (`python -m sglang.launch_server ...` or "
     "`sglang serve ...`), optionally with VAR=value prefixes, `\\` continuations and comments. Unbalanced "
     "quotes, two commands, or a different program are refused.",
     "The shell runs something else, or two servers, or fails on the unbalanced quote.",
     "Keep one launch command per file (one file for prefill, one for decode).",
     "python -m sglang.launch_server --model-path /m; python -m sglang.launch_server --model-path /m",
     "python -m sglang.launch_server --model-path /m"),
    ("SGL001", "unknown SGLang flag", "error",
     "The flag is not one SGLang's server parser declares (table generated from SGLang's ServerArgs).",
     _SGL + ": `launch_server: error: unrecognized arguments: --speculative-num-step 3`.",
     "Use the flag's full name; the finding names the closest known flag.",
     "--speculative-num-step 3", "--speculative-num-steps 3"),
    ("SGL002", "abbreviated SGLang flag", "warning",
     "SGLang's parser accepts a unique prefix of a flag (argparse allow_abbrev); the command works today but "
     "breaks as soon as SGLang adds a flag sharing the prefix, and `allow_abbrev=False` tools refuse it.",
     "Nothing today; `ambiguous option` after an SGLang upgrade.",
     "Write the flag's full name.", "--speculative-algo EAGLE", "--speculative-algorithm EAGLE"),
    ("SGL003", "wrong SGLang flag value", "error",
     "A flag's value does not convert to its type, is not one of its choices, is missing, or a switch was "
     "given a value; or a flag is given twice (the last wins), or a required flag (--model-path) is missing.",
     _SGL + ": `argument --page-size: invalid int value: 'sixteen'`.",
     "Give the flag a value of its type (the message quotes argparse's wording).",
     "--page-size sixteen", "--page-size 16"),
    ("SGL004", "SGLang --config file problem", "error",
     "`--config FILE` (SGLang's YAML of flag values) is resolved relative to the command file. It must exist, "
     "be a YAML mapping with a .yaml/.yml name, and must not name another config (SGLang allows one).",
     "SGLang: `Config file not found` / `Multiple config files specified! Only one allowed.` at start-up.",
     "Point --config at an existing YAML file next to the command file.",
     "--config missing.yaml", "--config server.yaml"),
    ("SGL005", "SGLang release checked", "info",
     "Flags are checked against one SGLang release's parser (specctl ships the flags of every release, generated "
     "from each release's own ServerArgs). The release is --sglang-version when given, else the SGLang of "
     "sglang.python, else the installed SGLang, else the newest. This note says when the version found is not "
     "itself in specctl's history and a neighbouring release was used instead.",
     "None by itself.", "Name the release you run: specctl validate --sglang-version 0.5.16 ...; "
     "specctl validate --list-sglang-versions lists them.", "", ""),
    ("SGL006", "flag of another SGLang release", "error",
     "The flag is not declared by the SGLang release checked, but other releases declare it: it was removed, "
     "renamed or split (e.g. --cuda-graph-max-bs into --cuda-graph-max-bs-decode/--cuda-graph-max-bs-prefill), "
     "or added in a later release. An error when you named the release (--sglang-version), a warning when "
     "specctl inferred it. The message names both releases and the new flag(s).",
     _SGL + " on that release: `unrecognized arguments: --cuda-graph-bs 1 2 4` or `ambiguous option: "
     "--cuda-graph-max-bs could match --cuda-graph-max-bs-decode, --cuda-graph-max-bs-prefill`.",
     "Write the flag the release declares (the finding names it), or check against the release you run.",
     "--cuda-graph-max-bs 32", "--cuda-graph-max-bs-decode 32"),
    ("SGL007", "choice of another SGLang release", "error",
     "The flag's value is not one of the choices of the SGLang release checked, but other releases accept it "
     "(a backend or mode added or removed between releases). Error or warning as for SGL006.",
     _SGL + ": `argument --attention-backend: invalid choice: ...`.",
     "Use one of the release's choices (listed in the finding), or check against the release you run.",
     "--attention-backend flashinfer_mla", "--attention-backend flashinfer"),
    ("SGL008", "flags of the front-end, not SGLang's", "info",
     "NVIDIA Dynamo's SGLang worker (`python -m dynamo.sglang`) takes SGLang's flags plus its own (--endpoint, "
     "--dyn-tool-call-parser, router flags ...; the list is generated from Dynamo's argument groups). Dynamo's "
     "own flags are skipped with their values and named in this note; SGLang's are checked as usual.",
     "None by itself.", "Nothing to fix.", "", ""),
):
    register(RuleDoc(_code, _title, _sev, _summary, _runtime, _fix, _before, _after))  # type: ignore[arg-type]


@dataclass(frozen=True)
class Word:
    text: str
    line: int
    col: int
    op: str = ""  # a shell operator (";", "&&", "||", "&", "|", "redir", "redir+target"), not a word


@dataclass
class Option:
    """One flag as given: resolved flag, value (converted), where it was written."""

    flag: Flag
    spelled: str
    value: Any
    line: int | None
    col: int | None
    from_config: str | None = None  # the --config file it came from


@dataclass
class SGLangCommand:
    name: str
    launcher: str = ""
    env: dict[str, str] = field(default_factory=dict)
    options: dict[str, Option] = field(default_factory=dict)  # by dest; the last occurrence wins
    findings: list[Finding] = field(default_factory=list)
    first_line: int = 1
    config_path: str | None = None
    base_dir: Path = Path(".")
    recognised: bool = False  # an SGLang launch command was found (flags may still be wrong)
    release: str | None = None  # the SGLang release whose flags are checked (None: the newest)
    release_named: bool = False  # the user named the release: other releases' flags are errors
    front_end_flags: list[str] = field(default_factory=list)  # the front-end's own flags, skipped (SGL008)

    @property
    def flags(self) -> FlagTable:
        """The flag table of the release checked."""
        return table(self.release)

    def value(self, dest: str) -> Any:
        """The value SGLang parses for `dest`: given, else the parser's default."""
        opt = self.options.get(dest)
        if opt is not None:
            return opt.value
        flag = self.flags.by_dest.get(dest)
        return flag.default if flag is not None else None

    def given(self, dest: str) -> bool:
        return dest in self.options

    def flag_name(self, dest: str) -> str:
        flag = self.flags.by_dest.get(dest)
        return flag.name if flag is not None else "--" + dest.replace("_", "-")

    def where(self, dest: str) -> tuple[int | None, int | None]:
        opt = self.options.get(dest)
        if opt is None:
            return self.first_line, None
        return opt.line, opt.col

    @property
    def role(self) -> str:
        mode = self.value("disaggregation_mode")
        return mode if mode in ("prefill", "decode") else "colocated"

    def add(self, code: str, severity: str, path: str, message: str, fix: str,
            line: int | None = None, col: int | None = None) -> None:
        self.findings.append(Finding(code, severity, path, message, fix,  # type: ignore[arg-type]
                                     line if line is not None else self.first_line, col))


class ShellError(Exception):
    def __init__(self, message: str, line: int, col: int) -> None:
        super().__init__(message)
        self.line = line
        self.col = col


def shell_words(text: str) -> list[list[Word]]:
    """POSIX-shell words grouped into commands (split at unquoted newlines and `;`, `&&`, `|` ...).

    Handles single quotes, double quotes (with `\\` escapes of `$`, `` ` ``, `"`, `\\`, newline),
    backslash escapes and `\\`-newline continuations, and `#` comments at the start of a word.
    Variables are not expanded. Raises ShellError (line, column) for an unbalanced quote.
    """
    commands: list[list[Word]] = []
    cur: list[Word] = []
    buf: list[str] = []
    in_word = False
    start = (1, 1)
    line, col = 1, 1
    i, n = 0, len(text)

    def end_word() -> None:
        nonlocal in_word
        if in_word:
            cur.append(Word("".join(buf), *start))
            buf.clear()
            in_word = False

    def end_command() -> None:
        nonlocal cur
        end_word()
        if cur:
            commands.append(cur)
        cur = []

    while i < n:
        c = text[i]
        if c == "\\":
            if i + 1 < n and text[i + 1] == "\n":  # continuation
                i += 2
                line, col = line + 1, 1
                continue
            if not in_word:
                in_word, start = True, (line, col)
            if i + 1 < n:
                buf.append(text[i + 1])
            i += 2
            col += 2
            continue
        if c in "'\"":
            if not in_word:
                in_word, start = True, (line, col)
            qline, qcol = line, col
            j = i + 1
            col += 1
            while True:
                if j >= n:
                    raise ShellError(f"unbalanced {'single' if c == chr(39) else 'double'} quote", qline, qcol)
                d = text[j]
                if d == c:
                    break
                if c == '"' and d == "\\" and j + 1 < n and text[j + 1] in '$`"\\\n':
                    if text[j + 1] != "\n":
                        buf.append(text[j + 1])
                    else:
                        line, col = line + 1, 0
                    j += 2
                    col += 2
                    continue
                buf.append(d)
                if d == "\n":
                    line, col = line + 1, 1
                else:
                    col += 1
                j += 1
            i = j + 1
            col += 1
            continue
        if c == "#" and not in_word:
            while i < n and text[i] != "\n":
                i += 1
            continue
        if c == "\n":
            end_command()
            i += 1
            line, col = line + 1, 1
            continue
        if c in " \t\r":
            end_word()
            i += 1
            col += 1
            continue
        if c in "<>" or (c == "&" and text[i + 1:i + 2] == ">"):
            # a redirection (`> log`, `2>&1`, `&>> log`, `< in`): not an argument of the command
            if in_word and "".join(buf).isdigit():
                buf.clear()
                in_word = False  # the fd number belongs to the operator
            end_word()
            j = i + 1
            while j < n and text[j] in "<>&|":
                j += 1
            op_text = text[i:j]
            dup = op_text.endswith("&") and j < n and (text[j].isdigit() or text[j] == "-")
            while dup and j < n and (text[j].isdigit() or text[j] == "-"):
                j += 1
            cur.append(Word(text[i:j], line, col, "redir" if dup else "redir+target"))
            col += j - i
            i = j
            continue
        if c in ";&|":
            end_word()
            op = text[i:i + 2] if text[i:i + 2] in ("&&", "||") else c
            cur.append(Word(op, line, col, op))
            i += len(op)
            col += len(op)
            continue
        if not in_word:
            in_word, start = True, (line, col)
        buf.append(c)
        i += 1
        col += 1
    end_command()
    # split on control operators; drop redirections (and their targets) and later pipeline stages (`| tee log`)
    out: list[list[Word]] = []
    for cmd in commands:
        part: list[Word] = []
        skip_target = piped = False
        for w in cmd:
            if w.op in (";", "&&", "||", "&"):
                if part:
                    out.append(part)
                part, skip_target, piped = [], False, False
            elif w.op == "|":
                piped = True
            elif w.op.startswith("redir"):
                skip_target = w.op == "redir+target"
            elif skip_target:
                skip_target = False
            elif not piped:
                part.append(w)
        if part:
            out.append(part)
    return out


def _launcher(words: list[Word]) -> tuple[str, int, dict[str, str]] | None:
    """(launcher text, index of the first argument, env assignments) when `words` run SGLang's server."""
    env: dict[str, str] = {}
    i = 0
    while i < len(words):
        w = words[i].text
        if _ASSIGN.match(w):
            k, _, v = w.partition("=")
            env[k] = v
            i += 1
        elif w in ("env", "exec", "nohup") and i + 1 < len(words):
            i += 1
        else:
            break
    if i >= len(words):
        return None
    prog = words[i].text
    if prog == "sglang" and i + 1 < len(words) and words[i + 1].text == "serve":
        return "sglang serve", i + 2, env
    if _PYTHON.match(prog):
        j = i + 1
        while j < len(words) and words[j].text.startswith("-") and words[j].text != "-m":
            j += 2 if words[j].text in ("-X", "-W") else 1
        if j + 1 < len(words) and words[j].text == "-m":
            mod = words[j + 1].text
            if mod == "sglang.launch_server":
                return f"{Path(prog).name} -m sglang.launch_server", j + 2, env
            if mod == "dynamo.sglang":
                return f"{Path(prog).name} -m {DYNAMO}", j + 2, env
            if mod == "sglang" and j + 2 < len(words) and words[j + 2].text == "serve":
                return f"{Path(prog).name} -m sglang serve", j + 3, env
    return None


def parse_command_text(text: str, *, name: str, base_dir: Path | None = None, release: str | None = None,
                       release_named: bool = False) -> SGLangCommand:
    cmd = SGLangCommand(name=name, base_dir=base_dir or Path(name).parent, release=release,
                        release_named=release_named)
    try:
        commands = shell_words(text)
    except ShellError as exc:
        cmd.add("SGL000", "error", "$", f"{exc}; the command cannot be read",
                "close the quote (shell quoting: '...' or \"...\")", exc.line, exc.col)
        return cmd
    if not commands:
        cmd.add("SGL000", "error", "$", "no command in the file",
                "write one SGLang launch command: python -m sglang.launch_server --model-path DIR ...")
        return cmd
    # `export VAR=value` / `VAR=value` lines only set the environment (launch scripts do this)
    env_lines = [c for c in commands if all(_ASSIGN.match(w.text) for w in (c[1:] if c[0].text == "export" else c))
                 and (c[0].text != "export" or len(c) > 1)]
    for c in env_lines:
        for w in c:
            if _ASSIGN.match(w.text):
                k, _, v = w.text.partition("=")
                cmd.env[k] = v
    commands = [c for c in commands if c not in env_lines]
    for c in [c for c in commands if c[0].text in PATH_CHANGING]:
        cmd.add("SGL000", "info", "$", f"`{' '.join(w.text for w in c)}` is not followed: relative --config and "
                "--speculative-adaptive-config paths are resolved against the command file's folder, "
                "--model-path against the working directory", "use absolute paths if the script changes "
                "directory", c[0].line, c[0].col)
    commands = [c for c in commands if c[0].text not in HARMLESS and c[0].text not in PATH_CHANGING]
    if not commands:
        cmd.add("SGL000", "error", "$", "no command in the file, only environment settings",
                "write one SGLang launch command: python -m sglang.launch_server --model-path DIR ...")
        return cmd
    launch = [(c, _launcher(c)) for c in commands]
    sglang_cmds = [(c, x) for c, x in launch if x is not None]
    if not sglang_cmds:
        first = commands[0]
        shown = " ".join(w.text for w in first[:3])
        cmd.first_line = first[0].line
        cmd.add("SGL000", "error", "$", f"not an SGLang launch command: `{shown} ...`",
                "expected `python -m sglang.launch_server ...`, `sglang serve ...` or `python -m dynamo.sglang ...` "
                "(one per file)", first[0].line)
        return cmd
    if len(commands) > 1:
        lines = ", ".join(str(c[0].line) for c in commands)
        cmd.add("SGL000", "error", "$", f"the file holds {len(commands)} commands (at lines {lines}); "
                "only the first SGLang launch command is checked",
                "keep one launch command per file (one file for prefill, one for decode)", commands[1][0].line)
    words, (launcher, start, env) = sglang_cmds[0]
    cmd.launcher, cmd.first_line, cmd.recognised = launcher, words[0].line, True
    cmd.env.update(env)
    parse_args(cmd, words[start:])
    if cmd.front_end_flags:
        shown = ", ".join(dict.fromkeys(cmd.front_end_flags))
        cmd.add("SGL008", "info", "$", f"flags of NVIDIA Dynamo's SGLang worker, not SGLang's, skipped: {shown}",
                "nothing to fix; SGLang's flags of the command are checked", words[0].line, words[0].col)
    return cmd


DYNAMO = "dynamo.sglang"


@functools.lru_cache(maxsize=1)
def dynamo_flags() -> dict[str, str]:
    """Every spelling of Dynamo's own worker flags -> how many values it takes (none|one|optional|list),
    from `dynamo_flags.json` (scripts/gen_dynamo_flags.py)."""

    data = json.loads((resources.files("specctl.schemas.sglang") / "dynamo_flags.json").read_text(encoding="utf-8"))
    return {name: f["takes"] for f in data["flags"] for name in f["names"]}


def _skip_front_end_flag(cmd: SGLangCommand, args: list[Word], i: int, spelled: str, eq: str) -> int | None:
    """When `spelled` is a Dynamo worker flag the checked SGLang release does not declare: record it and
    return the index after its values; else None."""
    if not cmd.launcher.endswith(DYNAMO) or spelled in cmd.flags.by_option:
        return None
    takes = dynamo_flags().get(spelled)
    if takes is None:
        return None
    cmd.front_end_flags.append(spelled)
    if eq or takes == "none":
        return i
    if takes in ("one", "optional"):
        return i + 1 if i < len(args) and not _is_option(args[i].text) else i
    while i < len(args) and not _is_option(args[i].text):
        i += 1
    return i


def _is_option(text: str) -> bool:
    return text.startswith("-") and not _NUMBER.match(text) and text != "-"


def parse_args(cmd: SGLangCommand, args: list[Word], *, from_config: str | None = None) -> None:
    """argparse's reading of SGLang's flags (of the release `cmd.release`), every error collected."""

    tab = cmd.flags
    i = 0
    config_words: list[Word] = []
    while i < len(args):
        w = args[i]
        i += 1
        if not _is_option(w.text):
            cmd.add("SGL003", "error", "$", f"unexpected argument {w.text!r} (SGLang takes flags only: "
                    f"`unrecognized arguments: {w.text}`)", "remove it, or give the flag it belongs to", w.line, w.col)
            continue
        spelled, eq, inline = w.text.partition("=")
        if spelled == "--config" and from_config is None:
            if eq:  # prepare_server_args merges only the exact token "--config"
                cmd.add("SGL004", "warning", "--config", f"--config={inline}: SGLang merges a config file only when "
                        f"written as two words; this one is never read (silently)", f"write --config {inline}",
                        w.line, w.col)
                continue
            config_words.append(w)
            if i < len(args) and not _is_option(args[i].text):
                config_words.append(args[i])
                i += 1
            else:
                cmd.add("SGL004", "error", "--config", "--config needs a file name (SGLang: 'No config file "
                        "specified after --config flag!')", "--config server.yaml", w.line, w.col)
            continue
        if from_config is None:
            after = _skip_front_end_flag(cmd, args, i, spelled, eq)
            if after is not None:
                i = after
                continue
        hit = tab.lookup(spelled) if spelled.startswith("--") else None
        other = elsewhere(spelled, tab.sglang_version) if spelled.startswith("--") and \
            (hit is None or hit[1] == "prefix") else None
        if hit is None:
            amb = tab.ambiguous(spelled)
            if other is not None:
                reads = f"; SGLang {tab.sglang_version} reads it as an ambiguous abbreviation of " \
                        f"{', '.join(amb[:5])}" if len(amb) > 1 else ""
                cmd.add("SGL006", "error" if cmd.release_named else "warning", spelled,
                        other.sentence() + reads, other.fix(), w.line, w.col)
            elif len(amb) > 1:
                cmd.add("SGL001", "error", spelled, f"ambiguous flag {spelled}: it abbreviates "
                        f"{', '.join(amb[:5])}{' ...' if len(amb) > 5 else ''} (SGLang {tab.sglang_version})",
                        "write the full name of the flag you mean", w.line, w.col)
            else:
                close = tab.closest(spelled)
                cmd.add("SGL001", "error", spelled, f"unknown SGLang flag {spelled} (SGLang {tab.sglang_version})",
                        f"did you mean {close}?" if close else "see `python -m sglang.launch_server --help`",
                        w.line, w.col)
            # skip its values, so they are not reported as stray arguments
            while i < len(args) and not _is_option(args[i].text) and not eq:
                i += 1
            continue
        flag, how = hit
        path = flag.name
        if how == "prefix":
            own = f"; in SGLang {other.span()} {spelled} is a flag of its own" if other is not None else ""
            cmd.add("SGL002", "warning", path, f"{spelled} is an abbreviation of {flag.name} in SGLang "
                    f"{tab.sglang_version}{own}", f"write {flag.name}", w.line, w.col)
        value: Any
        if not flag.takes_value:
            if eq:
                cmd.add("SGL003", "error", path, f"argument {flag.name}: ignored explicit argument {inline!r}",
                        f"write {flag.name} alone (a switch takes no value)", w.line, w.col)
                continue
            if flag.kind == "bool_optional":
                value = not (spelled.startswith("--no-") and not flag.name.startswith("--no-"))
            elif flag.kind == "store_false":
                value = False
            else:
                value = True
        else:
            raw: list[str] = []
            if eq:
                raw = [inline]
            elif flag.is_list or flag.nargs == "?":
                while i < len(args) and not _is_option(args[i].text):
                    raw.append(args[i].text)
                    i += 1
                    if flag.nargs == "?":
                        break
            elif i < len(args) and not _is_option(args[i].text):
                raw = [args[i].text]
                i += 1
            if not raw and flag.nargs not in ("*", "?"):
                want = "at least one argument" if flag.nargs == "+" else "one argument"
                cmd.add("SGL003", "error", path, f"argument {flag.name}: expected {want}",
                        f"give {flag.name} its value", w.line, w.col)
                continue
            values = []
            bad = False
            for r in raw:
                v, err = convert(flag, r)
                if err is not None:
                    _value_error(cmd, flag, r, err, w)
                    bad = True
                values.append(v)
            if bad:
                continue
            value = values if (flag.is_list or flag.nargs == "*") else (values[0] if values else None)
        if flag.dest in cmd.options and cmd.options[flag.dest].from_config is None and from_config is None:
            prev = cmd.options[flag.dest]
            cmd.add("SGL003", "warning", path, f"{flag.name} is given twice (line {prev.line} and {w.line}); "
                    "the last value wins", "remove one of them", w.line, w.col)
        if flag.refused is not None:
            cmd.add("SGL003", "error", path, f"SGLang {tab.sglang_version} refuses {flag.name} at start-up: "
                    f"{flag.refused!r}", f"remove {flag.name} (the message says what replaces it)", w.line, w.col)
        elif flag.deprecated:
            later = successor(flag.name, tab.sglang_version)
            cmd.add("SGL003", "warning", path, f"{flag.name} is deprecated in SGLang {tab.sglang_version}"
                    + (f"; {later}" if later else ""),
                    "see `python -m sglang.launch_server --help` for its replacement", w.line, w.col)
        if from_config is not None and flag.dest in cmd.options:
            continue  # the command line wins over --config
        cmd.options[flag.dest] = Option(flag, spelled, value, w.line, w.col, from_config)
    opts = [w for w in config_words if w.text == "--config"]
    if len(opts) > 1:
        cmd.add("SGL004", "error", "--config", "--config is given more than once (SGLang: 'Multiple config "
                "files specified! Only one allowed.')", "keep one --config", opts[1].line, opts[1].col)
    elif len(config_words) == 2:
        _read_config(cmd, config_words[0], config_words[1])
    if from_config is None and "model_path" not in cmd.options:
        cmd.add("SGL003", "error", "--model-path", "--model-path is missing (SGLang: 'the following arguments "
                "are required: --model-path/--model')", "add --model-path DIR (a local model directory)")


def _value_error(cmd: SGLangCommand, flag: Flag, text: str, err: str, w: Word) -> None:
    """SGL007 when the value is a choice of the flag in other releases, else SGL003 (argparse's words)."""


    release = cmd.flags.sglang_version
    if flag.choices is not None:
        value, type_err = convert(dataclasses.replace(flag, choices=None), text)
        others = choice_elsewhere(flag, value, release) if type_err is None else ()
        if others:
            cmd.add("SGL007", "error" if cmd.release_named else "warning", flag.name,
                    f"{flag.name} {text}: {text!r} is not a choice of {flag.name} in SGLang {release} (it is in "
                    f"SGLang {ranges(others)})", f"use one of SGLang {release}'s: "
                    f"{', '.join(str(c) for c in flag.choices)}; or check against the release you run with "
                    "--sglang-version", w.line, w.col)
            return
        err = f"{err} (SGLang {release})"
    cmd.add("SGL003", "error", flag.name, err, _value_fix(flag), w.line, w.col)


def _value_fix(flag: Flag) -> str:
    if flag.choices is not None:
        return f"use one of: {', '.join(str(c) for c in flag.choices)}"
    return f"give {flag.name} a value of type {flag.type}"


def _config_keys(flag: Flag) -> set[str]:
    """The YAML keys SGLang's ConfigArgumentMerger associates with a flag (dest and every long spelling)."""
    return {flag.dest} | {o[2:].replace("-", "_") for o in (flag.name, *flag.aliases)}


@functools.lru_cache(maxsize=8)
def _config_key_kinds(release: str) -> tuple[frozenset[str], dict[str, Flag]]:
    """(keys of store_true flags, keys of flags a config file cannot set) as ConfigArgumentMerger builds them:
    it supports store_true and one-value store actions; BooleanOptional and const actions are refused."""
    flags = table(release).flags
    store_true = frozenset(k for f in flags if f.kind == "store_true" for k in _config_keys(f))
    supported = {k for f in flags if f.kind in ("store_true", "store", "append") for k in _config_keys(f)}
    unsupported = {k: f for f in flags if f.kind not in ("store_true", "store", "append") and f.name != "--config"
                   for k in _config_keys(f) if k not in supported}
    return store_true, unsupported


def _read_config(cmd: SGLangCommand, opt: Word, file_word: Word) -> None:
    """`--config FILE` merged the way SGLang's ConfigArgumentMerger does (utils/server_args_config_parser.py):
    each YAML key becomes `--KEY` exactly as written (so `tp_size:` is `--tp_size`, which SGLang's parser
    refuses), True store_true flags become the bare flag, other booleans `--KEY true|false`, lists their
    items, mappings JSON, and the command line wins. FILE is resolved relative to the command file."""


    path = Path(file_word.text)
    if not path.is_absolute():
        path = cmd.base_dir / path
    cmd.config_path = str(path)
    if path.suffix.lower() not in (".yaml", ".yml"):
        cmd.add("SGL004", "error", "--config", f"--config {file_word.text}: SGLang reads only .yaml/.yml config "
                f"files ('Config file must be YAML format, got: {path.suffix}')", "rename it to .yaml",
                opt.line, opt.col)
        return
    try:
        text = read_text(path)
        if all(not ln.strip() or ln.lstrip().startswith("#") for ln in text.splitlines()):
            return  # SGLang reads an empty config as {}
        doc = parse_document(text, name=str(path))
    except UsageError as exc:
        cmd.add("SGL004", "error", "--config", f"--config {file_word.text} (resolved relative to the command "
                f"file: {path}): {exc}", exc.hint or "point --config at an existing YAML file", opt.line, opt.col)
        return
    store_true, unsupported = _config_key_kinds(cmd.flags.sglang_version)
    words: list[Word] = []
    for key, value in doc.data.items():
        norm = key.replace("-", "_")
        pos = doc.positions.get(child_path_of(key)) or (opt.line, 1)
        where = f"{path.name}:{pos[0]}"

        def word(t: str) -> Word:
            return Word(t, opt.line, opt.col)

        if norm == "config":
            cmd.add("SGL004", "warning", "--config", f"{where}: the config file names another config "
                    f"({value!r}); SGLang never reads a second config file (silently ignored; a config naming "
                    "itself does not loop)", "write the flags into this config file", opt.line, opt.col)
            continue
        if norm in unsupported:
            cmd.add("SGL004", "error", unsupported[norm].name, f"{where}: {key!r} cannot be set in a config file "
                    f"(SGLang: \"Unsupported config option '{norm}'\")", f"pass {unsupported[norm].name} on the "
                    "command line", opt.line, opt.col)
            continue
        if isinstance(value, bool):
            if norm in store_true:
                words += [word(f"--{key}")] if value else []
            else:
                words += [word(f"--{key}"), word(str(value).lower())]
        elif isinstance(value, list):
            if value:
                words += [word(f"--{key}"), *(word(_py_str(v)) for v in value)]
        elif isinstance(value, dict):
            words += [word(f"--{key}"), word(json.dumps(value))]
        else:
            words += [word(f"--{key}"), word(_py_str(value))]
    n = len(cmd.findings)
    parse_args(cmd, words, from_config=str(path))

    cmd.findings[n:] = [replace(f, message=f"in --config {path.name}: {f.message}") for f in cmd.findings[n:]]


def child_path_of(key: str) -> str:
    return child_path("$", key)


def _py_str(v: object) -> str:
    """`str(value)` as Python prints a YAML scalar (SGLang passes `str(value)` to its parser)."""
    return str(v)


def release_note(cmd: SGLangCommand, note: str) -> None:
    """SGL005 (info) naming the release checked when the version asked for or found is not in the history."""
    if note:
        cmd.add("SGL005", "info", "$", note, "name the release you run with --sglang-version (specctl validate "
                "--list-sglang-versions), or add it: python scripts/gen_sglang_flags.py --add VERSION")
