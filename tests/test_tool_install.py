"""`pip install specctl` (no extra) is the tool: a fresh virtual environment holding exactly specctl and the
distributions its base requirements resolve to (pyproject's `dependencies`, then each distribution's own
metadata, recursively, markers evaluated, no `extra`), linked from this environment's already-installed
copies (offline), runs validate, export, preflight, bench, model and adaptive simulate; torch (and every
other engine package) cannot be imported there at all. A command that needs the builtin engine says which
extra to install: exit 2, no traceback.

The servers (an SGLang-shaped prefill/decode pair for preflight, a stub OpenAI server for bench) run in this
process on 127.0.0.1; only the specctl commands run in the tool environment.
"""

from __future__ import annotations

import importlib.metadata as md
import json
import os
import subprocess
import sys
import sysconfig
import venv
from collections.abc import Iterator
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from sglang_fixture_server import FixtureServer, fixture, json_answer

from specctl.bench.stub_server import StubBehaviour, StubServer
from specctl.engine.install import ENGINE_MODULES

pytestmark = pytest.mark.slow
ROOT = Path(__file__).resolve().parents[1]


def _name(dist: md.Distribution) -> str:
    return dist.metadata["Name"].lower().replace("_", "-")


def installed(name: str) -> md.Distribution:
    """The distribution installed in this environment's site-packages (never a source tree's egg-info)."""
    found = list(md.distributions(name=name, path=[sysconfig.get_paths()["purelib"]]))
    assert found, f"{name} is not installed in {sysconfig.get_paths()['purelib']}"
    return found[0]


def tool_distributions() -> dict[str, md.Distribution]:
    """specctl and every distribution `pip install specctl` pulls in: pyproject's base requirements (the
    source, not a possibly stale installed copy of it), recursively through each one's metadata."""
    import tomllib

    base = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["project"]["dependencies"]
    out: dict[str, md.Distribution] = {"specctl": installed("specctl")}
    todo = [Requirement(line) for line in base]
    while todo:
        req = todo.pop()
        if req.marker is not None and not req.marker.evaluate({"extra": ""}):
            continue
        dist = installed(req.name)
        key = _name(dist)
        if key in out and not req.extras:
            continue
        out[key] = dist
        for line in dist.requires or []:
            sub = Requirement(line)
            envs = [{"extra": e} for e in req.extras] or [{"extra": ""}]
            if sub.marker is None or any(sub.marker.evaluate(env) for env in envs):
                sub.marker = None
                todo.append(sub)
    return out


def site_packages(prefix: Path) -> Path:
    return prefix / "lib" / f"python{sys.version_info.major}.{sys.version_info.minor}" / "site-packages"


@pytest.fixture(scope="module")
def tool_python(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A fresh venv (no pip, no system site-packages) with only the tool's distributions, linked in."""
    prefix = tmp_path_factory.mktemp("tool-venv")
    venv.EnvBuilder(with_pip=False, symlinks=True).create(prefix)
    dest = site_packages(prefix)
    dists = tool_distributions()
    assert "torch" not in dists and "smg" in dists
    for dist in dists.values():
        tops = {Path(str(f)).parts[0] for f in dist.files or [] if not str(f).startswith("..")}
        for top in tops:
            src = Path(str(dist.locate_file(top)))
            if src.exists() and not (dest / top).exists():
                (dest / top).symlink_to(src, target_is_directory=src.is_dir())
    return prefix / "bin" / "python"


def specctl(python: Path, *args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    env.update(HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1", NO_COLOR="1", COLUMNS="200")
    return subprocess.run([str(python), "-m", "specctl.cli", *args], capture_output=True, text=True,
                          timeout=timeout, cwd=ROOT, env=env, check=False)


def test_the_tool_environment_has_no_engine_package(tool_python: Path) -> None:
    code = ("import importlib.util, json, sys; "
            f"print(json.dumps([m for m in {list(ENGINE_MODULES)!r} if importlib.util.find_spec(m)]))")
    res = subprocess.run([str(tool_python), "-c", code], capture_output=True, text=True, timeout=60, check=True)
    assert json.loads(res.stdout) == []


def test_validate_and_export_run_without_torch(tool_python: Path) -> None:
    res = specctl(tool_python, "validate", "presets/tiny-pd.yaml")
    assert res.returncode == 0, res.stdout + res.stderr
    res = specctl(tool_python, "export", "sglang", "-c", "tiny-pd", "--format", "json")
    assert res.returncode == 0, res.stdout + res.stderr
    doc = json.loads(res.stdout)
    assert doc["router"][:2] == ["smg", "launch"] and "--disaggregation-mode" in doc["prefill"]


def test_model_and_adaptive_simulate_run_without_torch(tool_python: Path) -> None:
    res = specctl(tool_python, "model", "engine/builtin_models/tiny-hybrid", "--format", "json")
    assert res.returncode == 0, res.stdout + res.stderr
    res = specctl(tool_python, "adaptive", "simulate", "tiny-colocated", "--trace",
                  "tests/data/adaptive/traces/phases.jsonl", "--format", "json")
    assert res.returncode == 0, res.stdout + res.stderr
    assert any('"switched"' in line for line in res.stdout.splitlines())


@pytest.fixture
def sglang_pair() -> Iterator[tuple[str, str]]:
    bootstrap = FixtureServer({"/route": [json_answer(fixture("route_prefill.json"))]})
    info = {**fixture("server_info_prefill.json"), "disaggregation_bootstrap_port": bootstrap.port}
    prefill = FixtureServer({"/server_info": [json_answer(info)],
                             "/model_info": [json_answer(fixture("model_info_prefill.json"))]})
    decode = FixtureServer({"/server_info": [json_answer(fixture("server_info_decode.json"))],
                            "/model_info": [json_answer(fixture("model_info_decode.json"))]})
    try:
        yield prefill.url, decode.url
    finally:
        for s in (prefill, decode, bootstrap):
            s.close()


def test_preflight_runs_without_torch(tool_python: Path, sglang_pair: tuple[str, str]) -> None:
    res = specctl(tool_python, "preflight", "--prefill", sglang_pair[0], "--decode", sglang_pair[1],
                  "--timeout", "10", "--format", "json")
    assert res.returncode == 0, res.stdout + res.stderr
    assert json.loads(res.stdout)["ok"] is True


def test_bench_runs_without_torch(tool_python: Path, tmp_path: Path) -> None:
    out = tmp_path / "bench.jsonl"
    with StubServer(StubBehaviour(ttft_s=0.005, itl_s=0.002)) as stub:
        res = specctl(tool_python, "bench", "--url", stub.url, "--num-prompts", "6", "--random-input-len", "16",
                      "--random-output-len", "6", "--no-progress", "--format", "json", "--output", str(out))
    assert res.returncode == 0, res.stdout + res.stderr
    records = [json.loads(line) for line in out.read_text(encoding="utf-8").splitlines() if line.strip()]
    assert records and all(r.get("completed", 6) == 6 for r in records if "completed" in r)


@pytest.mark.parametrize("args", [
    ("serve", "--role", "colocated", "-c", "tiny-colocated"),
    ("up", "-c", "tiny-pd"),
    ("generate", "-c", "tiny-colocated", "--prompt", "hi"),
])
def test_an_engine_command_names_the_extra_to_install(tool_python: Path, args: tuple[str, ...]) -> None:
    res = specctl(tool_python, *args)
    text = res.stdout + res.stderr
    assert res.returncode == 2, text
    assert 'specctl[engine]' in text and "torch" in text and "Traceback" not in text


def test_every_package_of_the_engine_extra_is_one_the_engine_check_knows() -> None:
    """`require_engine` names what the `engine` extra installs: each of its distributions provides one of
    ENGINE_MODULES, and every one of those comes from the extra (none from the tool's own requirements)."""
    import tomllib

    project = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["project"]
    provided: set[str] = set()
    for line in project["optional-dependencies"]["engine"]:
        dist = installed(Requirement(line).name)
        tops = {Path(str(f)).parts[0].removesuffix(".py") for f in dist.files or [] if not str(f).startswith("..")}
        assert tops & set(ENGINE_MODULES), (line, sorted(tops))
        provided |= tops & set(ENGINE_MODULES)
    assert provided == set(ENGINE_MODULES)
    assert not {Requirement(line).name for line in project["dependencies"]} & set(ENGINE_MODULES)
