"""A single-node Slurm cluster on this machine for tests: munged, slurmctld and slurmd in a temporary
directory, stopped when the context exits.

Contract: `slurm_cluster(tmp_path)` yields a `Cluster` (its `env` carries SLURM_CONF for sbatch/squeue/
scancel) or raises `ClusterUnavailable` with the reason (not root, packages missing and not installable,
a daemon that did not come up). Packages: Debian's `slurm-wlm` and `munge`; as root they are installed with
apt-get when missing (CI runs as root). Config: linuxproc process tracking, no task plugin, cgroup.conf with
`CgroupPlugin=autodetect` + `IgnoreSystemd=yes` (slurmd refuses `disabled`), one node with this machine's
CPUs, ports picked free, every daemon in the foreground of a child process.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import socket
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

DAEMONS = ("slurmctld", "slurmd", "munged", "sbatch", "scontrol")


class ClusterUnavailable(Exception):
    pass


@dataclass
class Cluster:
    root: Path
    env: dict[str, str]
    node: str

    def run(self, *argv: str, timeout: float = 30.0) -> subprocess.CompletedProcess[str]:
        return subprocess.run(list(argv), env=self.env, capture_output=True, text=True, timeout=timeout, check=False)

    def job_state(self, job: str) -> str:
        out = self.run("scontrol", "show", "job", job).stdout
        for part in out.split():
            if part.startswith("JobState="):
                return part.split("=", 1)[1]
        return "UNKNOWN"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _which(name: str) -> str | None:
    return shutil.which(name) or next((p for d in ("/usr/sbin", "/usr/bin", "/sbin")
                                       if os.access(p := f"{d}/{name}", os.X_OK)), None)


def ensure_packages() -> None:
    if all(_which(d) for d in DAEMONS):
        return
    if os.geteuid() != 0:
        raise ClusterUnavailable("slurm-wlm/munge are not installed and installing them needs root")
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    for argv in (["apt-get", "update"], ["apt-get", "install", "-y", "slurm-wlm", "munge"]):
        r = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=600, check=False)
        if r.returncode != 0:
            raise ClusterUnavailable(f"{' '.join(argv)} failed: {r.stderr[-500:]}")
    if not all(_which(d) for d in DAEMONS):
        raise ClusterUnavailable("slurm-wlm/munge installed but their programs are missing")


def _munge_ok() -> bool:
    if not _which("munge") or not _which("unmunge"):
        return False
    try:
        cred = subprocess.run(["munge", "-n"], capture_output=True, timeout=5, check=False)
        back = subprocess.run(["unmunge"], input=cred.stdout, capture_output=True, timeout=5, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return False
    return cred.returncode == 0 and back.returncode == 0


def _start_munge(procs: list[subprocess.Popen[bytes]]) -> None:
    if _munge_ok():
        return
    key = Path("/etc/munge/munge.key")
    if not key.exists():
        subprocess.run(["mungekey", "--create"], capture_output=True, timeout=30, check=False)
        if not key.exists():
            key.write_bytes(os.urandom(128))
        shutil.chown(key, "munge", "munge")
        key.chmod(0o400)
    for d in ("/run/munge", "/var/log/munge", "/var/lib/munge"):
        Path(d).mkdir(parents=True, exist_ok=True)
        shutil.chown(d, "munge", "munge")
    procs.append(subprocess.Popen(["runuser", "-u", "munge", "--", str(_which("munged")), "--foreground"],
                                  stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
    deadline = time.monotonic() + 15
    while time.monotonic() < deadline:
        if _munge_ok():
            return
        time.sleep(0.2)
    raise ClusterUnavailable("munged did not start")


def _conf(root: Path, node: str) -> Path:
    cpus = os.cpu_count() or 1
    conf = root / "slurm.conf"
    conf.write_text("\n".join([
        "ClusterName=specctl-test",
        f"SlurmctldHost={node}(127.0.0.1)",  # the daemons talk over loopback, whatever the hostname resolves to
        "SlurmUser=root",
        "AuthType=auth/munge",
        f"StateSaveLocation={root}/state",
        f"SlurmdSpoolDir={root}/spool",
        f"SlurmctldPidFile={root}/slurmctld.pid",
        f"SlurmdPidFile={root}/slurmd.pid",
        f"SlurmctldPort={_free_port()}",
        f"SlurmdPort={_free_port()}",
        f"SlurmctldLogFile={root}/slurmctld.log",
        f"SlurmdLogFile={root}/slurmd.log",
        "ProctrackType=proctrack/linuxproc",
        "TaskPlugin=task/none",
        "SelectType=select/cons_tres",
        "SelectTypeParameters=CR_CPU",
        "SchedulerType=sched/builtin",
        "ReturnToService=2",
        "MpiDefault=none",
        "JobCompType=jobcomp/none",
        "AccountingStorageType=accounting_storage/none",
        "SlurmdTimeout=30",
        "InactiveLimit=0",
        "KillWait=5",
        f"NodeName={node} NodeAddr=127.0.0.1 CPUs={cpus} State=UNKNOWN",
        f"PartitionName=test Nodes={node} Default=YES MaxTime=INFINITE State=UP OverSubscribe=FORCE:4",
        "",
    ]))
    (root / "cgroup.conf").write_text("CgroupPlugin=autodetect\nIgnoreSystemd=yes\n")
    for d in ("state", "spool"):
        (root / d).mkdir()
    return conf


@contextlib.contextmanager
def slurm_cluster(root: Path) -> Iterator[Cluster]:
    if os.geteuid() != 0:
        raise ClusterUnavailable("a local Slurm cluster needs root (slurmd runs jobs as their user)")
    ensure_packages()
    node = socket.gethostname().split(".")[0]
    procs: list[subprocess.Popen[bytes]] = []
    try:
        _start_munge(procs)
        conf = _conf(root, node)
        env = {**os.environ, "SLURM_CONF": str(conf)}
        procs.append(subprocess.Popen([str(_which("slurmctld")), "-D", "-c", "-f", str(conf)], env=env,
                                      stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
        procs.append(subprocess.Popen([str(_which("slurmd")), "-D", "-f", str(conf)], env=env,
                                      stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
        cluster = Cluster(root, env, node)
        deadline = time.monotonic() + 60
        while True:
            out = cluster.run("sinfo", "-h", "-o", "%T", timeout=10).stdout.strip()
            if out and out.split()[0] in ("idle", "mixed", "allocated"):
                break
            if time.monotonic() > deadline or any(p.poll() is not None for p in procs[-2:]):
                logs = "".join((root / f).read_text()[-800:] for f in ("slurmctld.log", "slurmd.log")
                               if (root / f).exists())
                raise ClusterUnavailable(f"the Slurm daemons did not come up (sinfo: {out!r}): {logs}")
            time.sleep(0.5)
        yield cluster
    finally:
        for p in reversed(procs):
            if p.poll() is None:
                p.terminate()
        for p in reversed(procs):
            try:
                p.wait(timeout=20)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait(timeout=5)
