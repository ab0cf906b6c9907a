"""Which SGLang release a launch command is checked against, found without importing SGLang.

Contract: `choose_release(requested, python)` returns a `ReleaseChoice`: `requested` (a version the
user named, `--sglang-version`) when given; else the release of the SGLang that `python` (the
deployment's `sglang.python`) has; else the release of an SGLang installed beside specctl; else the
history's newest. A version the history lacks maps to the newest release before it (`note` says so).
`named` is True only for a requested version: findings about flags of other releases are errors then,
warnings otherwise. A requested string that is not a version, or one older than every release of the
history, is a `UsageError` (exit 2).
`python_sglang_version(python)` reads the version from the `sglang-X.dist-info` folder name of that
interpreter's site-packages: a path scan next to the interpreter first, else one short child
(`python -c 'import sys; print(sys.path)'`, which imports no SGLang); None when there is none.
"""

from __future__ import annotations

import functools
import json
import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

from specctl.errors import UsageError
from specctl.schemas.sglang.flags import newest, pick_release, releases


@dataclass(frozen=True)
class ReleaseChoice:
    release: str  # a release of the flag history
    named: bool  # the user named it (--sglang-version)
    source: str  # how it was chosen, for messages: "--sglang-version 0.5.16", "sglang.python (...)", ...
    note: str = ""  # set when the version found is not itself in the history


def _dist_info_version(folder: str | Path) -> str | None:
    try:
        with os.scandir(folder) as it:
            for e in it:
                n = e.name
                if n.startswith("sglang-") and n.endswith(".dist-info"):
                    return n[len("sglang-"):-len(".dist-info")]
    except OSError:
        return None
    return None


@functools.lru_cache(maxsize=1)
def installed_sglang_version() -> str | None:
    """The version of an SGLang installed for the interpreter running specctl (a `sglang-X.dist-info`
    folder on sys.path), or None. Scanning folders is ~10x cheaper than `importlib.metadata`."""
    for entry in sys.path:
        found = _dist_info_version(entry or ".")
        if found is not None:
            return found
    return None


@functools.lru_cache(maxsize=8)
def python_sglang_version(python: str) -> str | None:
    """The SGLang version of the interpreter `python` (see the module doc); None when it has none or
    cannot run."""
    exe = Path(python)
    if exe.resolve() == Path(sys.executable).resolve():
        return installed_sglang_version()
    for lib in ("lib", "lib64"):
        for site in sorted((exe.parent.parent / lib).glob("python3*/site-packages")):
            found = _dist_info_version(site)
            if found is not None:
                return found

    try:
        proc = subprocess.run([str(exe), "-c", "import json, sys; print(json.dumps(sys.path))"],
                              capture_output=True, text=True, timeout=10,
                              env={**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"})
        paths = json.loads(proc.stdout) if proc.returncode == 0 else []
    except (OSError, subprocess.SubprocessError, ValueError):
        return None
    for entry in paths:
        if isinstance(entry, str) and entry:
            found = _dist_info_version(entry)
            if found is not None:
                return found
    return None


def choose_release(requested: str | None, python: str | None) -> ReleaseChoice:
    if requested is not None:
        pick = pick_release(requested)
        if pick is None:
            raise UsageError(f"--sglang-version {requested!r}: not an SGLang version number",
                             hint="e.g. --sglang-version 0.5.16; specctl validate --list-sglang-versions lists them")
        if pick.older_than_all:
            raise UsageError(f"--sglang-version {requested}: older than every release specctl knows "
                             f"({releases()[0]} to {newest()})",
                             hint="specctl validate --list-sglang-versions lists the known releases")
        note = "" if pick.exact else f"SGLang {requested} is not in specctl's flag history; checked against " \
                                     f"{pick.release}, the newest release before it"
        return ReleaseChoice(pick.release, True, f"--sglang-version {requested}", note)
    found: str | None = None
    source = ""
    if python:
        found = python_sglang_version(python)
        source = f"the SGLang of sglang.python ({python})"
    if found is None:
        found = installed_sglang_version()
        source = "the installed SGLang"
    if found is not None:
        pick = pick_release(found)
        if pick is not None:
            note = "" if pick.exact else f"{source} is {found}, which specctl's flag history lacks; checked " \
                                         f"against {pick.release}" + (", its oldest release" if pick.older_than_all
                                                                     else ", the newest release before it")
            return ReleaseChoice(pick.release, False, f"{source}, {found}", note)
    return ReleaseChoice(newest(), False, "the newest release specctl knows (no SGLang found; name yours with "
                                          "--sglang-version)")
