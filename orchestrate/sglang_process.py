"""`engine: sglang`: the SGLang server command of one role, the check that SGLang is there, the exec.

Contract (torch- and sglang-free; the launcher and `specctl serve` import it):
- `sglang_python(deployment)` is `sglang.python` from the deployment, else the interpreter running specctl.
- `role_command(deployment, role, index, *, python, workdir)` is `(argv, files)`: the exported SGLang
  command of that role instance (`schemas.sglang.export.role_argv`, the same argv `export_commands` gives
  instance 0) with `python` in front and its adaptive JSON file under `workdir` (absolute path), and the
  files to write before it runs (path -> text).
- `check_sglang(python)` raises `RuntimeFailure` (exit 3) when `python` cannot run or cannot import
  SGLang, naming the interpreter and how to fix it; it runs `python -c` with only `importlib.util`, so it
  costs a fraction of a second and imports nothing heavy.
- `exec_role(deployment, role, index)` checks, writes the files and replaces this process with SGLang's
  `python -m sglang.launch_server ...` (`HF_HUB_OFFLINE=1`, `TRANSFORMERS_OFFLINE=1` in its environment).
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
from pathlib import Path

from specctl.errors import RuntimeFailure
from specctl.orchestrate.router import OFFLINE_ENV, role_instances
from specctl.schemas.deployment import Deployment
from specctl.schemas.sglang.export import role_argv

ENGINE_ROLES = ("prefill", "decode", "colocated")
_CHECK = "import importlib.util, sys; sys.exit(0 if importlib.util.find_spec('sglang') else 7)"
_FIX = ("install SGLang into that environment (pip install 'sglang==0.5.23'; it needs a GPU machine), or point "
        "the deployment at a Python that has it: --set sglang.python=/path/to/venv/bin/python; engine: builtin "
        "runs specctl's own engine instead")


def sglang_python(deployment: Deployment) -> str:
    return deployment.sglang_python or sys.executable


def default_workdir(deployment: Deployment) -> Path:
    """Where `specctl serve` writes the files an SGLang command references (one folder per deployment)."""
    return Path(tempfile.gettempdir()) / "specctl-sglang" / deployment.name


def adaptive_file_for(workdir: str | Path, role: str, index: int = 0) -> str:
    suffix = f".{index}" if index else ""
    return str(Path(workdir).resolve() / f"{role}{suffix}.adaptive.json")


def role_command(deployment: Deployment, role: str, index: int = 0, *, python: str,
                 workdir: str | Path) -> tuple[list[str], dict[str, str]]:
    """The SGLang argv of one role instance (python first) and the files it references."""

    if role not in ENGINE_ROLES:
        raise RuntimeFailure(f"engine: sglang has no {role!r} server",
                             hint="the router is smg (or sglang-router) for any engine: specctl serve --role router")
    instances = role_instances(deployment, role)
    if not 0 <= index < len(instances):
        raise RuntimeFailure(f"roles.{role} has {len(instances)} instance(s); there is no instance {index}",
                             hint=f"--instance 0..{len(instances) - 1}")
    argv, files = role_argv(instances[index], role, adaptive_file=adaptive_file_for(workdir, role, index))
    return [python, *argv[1:]], files


def check_sglang(python: str) -> None:
    """RuntimeFailure unless `python` runs and can import sglang."""
    try:
        proc = subprocess.run([python, "-c", _CHECK], capture_output=True, text=True, timeout=60,
                              env={**os.environ, **OFFLINE_ENV}, stdin=subprocess.DEVNULL)
    except (OSError, subprocess.SubprocessError) as exc:
        raise RuntimeFailure(f"engine: sglang: cannot run the SGLang Python {python!r}: {exc}",
                             hint=f"sglang.python must be an executable Python; {_FIX}") from None
    if proc.returncode == 7:
        raise RuntimeFailure(f"engine: sglang: SGLang is not importable by {python}", hint=_FIX)
    if proc.returncode != 0:
        why = (proc.stderr or proc.stdout).strip().splitlines()[-1:] or [f"exit code {proc.returncode}"]
        raise RuntimeFailure(f"engine: sglang: {python} failed to look SGLang up: {why[0]}", hint=_FIX)


def write_files(files: dict[str, str]) -> None:
    for name, text in files.items():
        path = Path(name)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text, encoding="utf-8")


def exec_role(deployment: Deployment, role: str, index: int = 0, *, workdir: str | Path | None = None) -> None:
    """Replace this process with the SGLang server of `role` (returns only by raising RuntimeFailure)."""
    python = sglang_python(deployment)
    where = Path(workdir) if workdir is not None else default_workdir(deployment)
    argv, files = role_command(deployment, role, index, python=python, workdir=where)
    check_sglang(python)
    write_files(files)
    print("exec:", " ".join(argv), file=sys.stderr, flush=True)
    try:
        os.execvpe(python, argv, {**os.environ, **OFFLINE_ENV})
    except OSError as exc:
        raise RuntimeFailure(f"engine: sglang: cannot exec {python}: {exc}", hint=_FIX) from None
