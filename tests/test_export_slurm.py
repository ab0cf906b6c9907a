"""`specctl export slurm` on a real single-node Slurm cluster (slurmctld + slurmd on this machine).

The exported script of tiny-pd (builtin engine) is submitted with `sbatch`: its prefill and decode run as
`srun` steps, the preflight passes, the router starts and a completion comes back through it. Then the
same script with decode's line edited (as a hand edit would do) is submitted: `--set cache.page_size=32` is
refused by the builtin decode's own handshake (its rows land in the job's output), `--set
serve.max_batch_size=2` (not exchanged by the handshake) by the preflight against the deployment; either way
the job ends with status 3 and the router never starts. The cluster stops when the module ends.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from slurm_cluster import Cluster, ClusterUnavailable, slurm_cluster

from specctl.orchestrate.ports import free_ports

BIN = Path(sys.executable).parent
JOB_TIMEOUT_S = 300.0


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    root = tmp_path_factory.mktemp("slurm")
    try:
        ctx = slurm_cluster(root)
        c = ctx.__enter__()
    except ClusterUnavailable as exc:
        pytest.skip(f"no local Slurm cluster: {exc}")
    try:
        c.env.update({"PATH": f"{BIN}:{os.environ.get('PATH', '')}", "HF_HUB_OFFLINE": "1",
                      "TRANSFORMERS_OFFLINE": "1", "OMP_NUM_THREADS": "1"})
        yield c
    finally:
        ctx.__exit__(None, None, None)


def export(tmp: Path) -> tuple[Path, dict[str, int]]:
    p, b, d, r = free_ports(4)
    ports = {"prefill": p, "bootstrap": b, "decode": d, "router": r}
    sets = [f"roles.prefill.port={p}", f"roles.prefill.bootstrap_port={b}", f"roles.decode.port={d}",
            f"roles.router.port={r}"]
    argv = [str(BIN / "specctl"), "export", "slurm", "-c", "tiny-pd", "--out", str(tmp)]
    for s in sets:
        argv += ["--set", s]
    out = subprocess.run(argv, capture_output=True, text=True, timeout=120, check=False)
    assert out.returncode == 0, out.stderr
    return tmp / "tiny-pd.sbatch", ports


def submit(cluster: Cluster, script: Path) -> str:
    r = cluster.run("sbatch", "--parsable", "-D", str(script.parent), "--export=ALL", str(script))
    assert r.returncode == 0, r.stderr
    return r.stdout.strip().split(";")[0]


def output(script: Path, job: str) -> str:
    f = script.parent / f"tiny-pd-{job}.out"
    return f.read_text(errors="replace") if f.exists() else ""


def wait_for(cluster: Cluster, script: Path, job: str, needle: str, *, done_ok: bool = False) -> str:
    deadline = time.monotonic() + JOB_TIMEOUT_S
    while time.monotonic() < deadline:
        text = output(script, job)
        state = cluster.job_state(job)
        if needle in text:
            return text
        if state not in ("PENDING", "RUNNING", "CONFIGURING", "COMPLETING"):
            if done_ok:
                return text
            raise AssertionError(f"job {job} ended ({state}) before {needle!r}:\n{text[-4000:]}")
        time.sleep(1)
    raise AssertionError(f"job {job}: no {needle!r} in {JOB_TIMEOUT_S}s:\n{output(script, job)[-4000:]}")


def http(method: str, url: str, body: dict[str, Any] | None = None) -> Any:
    data = json.dumps(body).encode() if body is not None else None
    req = urllib.request.Request(url, data=data, method=method, headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=120) as resp:  # noqa: S310 - loopback
        return json.loads(resp.read(1 << 20))


@pytest.mark.slow
@pytest.mark.timeout(900)  # the first test also starts the cluster (and installs slurm-wlm where it is missing)
def test_exported_job_serves_through_the_router_after_preflight(cluster: Cluster, tmp_path: Path) -> None:
    script, ports = export(tmp_path)
    job = submit(cluster, script)
    try:
        text = wait_for(cluster, script, job, "specctl: router ready")
        assert text.index("ok: prefill and decode agree") < text.index("specctl: preflight passed; starting the router")
        url = f"http://127.0.0.1:{ports['router']}"
        model = http("GET", url + "/v1/models")["data"][0]["id"]
        res = http("POST", url + "/v1/completions", {"model": model, "prompt": "def add(a, b):", "max_tokens": 4,
                                                      "temperature": 0, "ignore_eos": True})
        assert res["usage"]["completion_tokens"] == 4
        assert isinstance(res["choices"][0]["text"], str)
    finally:
        cluster.run("scancel", job)
    wait_for(cluster, script, job, "\0never\0", done_ok=True)
    assert cluster.job_state(job) in ("CANCELLED", "COMPLETED", "FAILED")


@pytest.mark.slow
@pytest.mark.timeout(600)
@pytest.mark.parametrize(("edit", "row"), [
    # the builtin decode's own handshake refuses it at start-up: the job stops on the dead step
    ("cache.page_size=32", "page_size"),
    # not exchanged by the handshake: the preflight (against the deployment) refuses it
    ("serve.max_batch_size=2", "preflight refused the pair"),
])
def test_mismatched_decode_stops_the_job_before_the_router(cluster: Cluster, tmp_path: Path, edit: str,
                                                           row: str) -> None:
    script, _ = export(tmp_path)
    text = script.read_text()
    line = "--role decode -c deploy.yaml"
    assert text.count(line) == 1
    script.write_text(text.replace(line, f"{line} --set {edit}"))
    job = submit(cluster, script)
    out = wait_for(cluster, script, job, "\0never\0", done_ok=True)
    assert row in out, out[-4000:]
    assert "starting the router" not in out
    show = cluster.run("scontrol", "show", "job", job).stdout
    assert "ExitCode=3:0" in show, show


@pytest.mark.parametrize("extra", [[], ["--spread"], ["--gpus", "8", "--nodes", "2"], ["--router", "sglang-router"]])
def test_scripts_of_sglang_deployments_are_valid_bash(tmp_path: Path, extra: list[str]) -> None:
    argv = [str(BIN / "specctl"), "export", "slurm", "-c", "llama-3.1-8b-pd", "--set", "engine=sglang"]
    res = subprocess.run([*argv, "--out", str(tmp_path), *extra], capture_output=True, text=True, timeout=120,
                         check=False)
    assert res.returncode == 0, res.stderr
    script = tmp_path / "llama-3-1-8b-pd.sbatch"
    text = script.read_text()
    check = subprocess.run(["bash", "-n", str(script)], capture_output=True, text=True, timeout=30, check=False)
    assert check.returncode == 0, check.stderr
    assert "python -m sglang.launch_server" in text and "cat > adaptive.json" in text
    assert text.index("specctl preflight") < text.index("starting the router")
    if "--nodes" in extra:
        assert "#SBATCH --nodes=4" in text and "--node-rank \"$SLURM_PROCID\"" in text and "--tp-size 16" in text
    elif "--spread" in extra:
        assert "#SBATCH --nodes=2" in text and "--host 0.0.0.0" in text and "${NODES[1]}" in text
        assert "--base-gpu-id" not in text
    else:
        assert "#SBATCH --nodes=1" in text and "--base-gpu-id 1" in text
