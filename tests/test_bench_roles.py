"""`specctl bench -c` behind the router (smg) reads the launched roles themselves; `bench --url` of smg its workers.

The router has no engine `/server_info` or `/metrics`: the bench's snapshots go to every prefill and
decode instance (bench/probe.py `DeploymentProbe`) while the load goes through the router. End to end
here: the real CLI launches tiny-pd (real prefill, decode and smg processes on free loopback
ports) and the record must carry the decode's fingerprint, the adaptive block and per-instance
/metrics deltas that agree with what the client itself counted. The merge rules for several
instances are checked against hand-computed values.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import yaml

from specctl.bench.probe import merge_metrics, merge_server_info
from specctl.orchestrate.ports import free_ports
from specctl.schemas import server_info as si
from specctl.schemas.prometheus import metrics_delta, sglang_metrics

ROOT = Path(__file__).resolve().parents[1]


def test_merged_metrics_keep_each_instance_apart_and_diff_per_instance() -> None:
    before = {"decode": "# TYPE specctl_requests_total counter\nspecctl_requests_total{status=\"length\"} 2\n",
              "decode.1": "# TYPE specctl_requests_total counter\nspecctl_requests_total{status=\"length\"} 5\n",
              "router": None}
    after = {"decode": "# TYPE specctl_requests_total counter\nspecctl_requests_total{status=\"length\"} 7\n",
             "decode.1": "# TYPE specctl_requests_total counter\nspecctl_requests_total{status=\"length\"} 6\n"
                         "sglang:num_queue_reqs 3\n",
             "router": "# HELP x_total x\n# TYPE x_total counter\nx_total 4\n"}
    text = merge_metrics(after)
    assert text is not None and text.count("# TYPE specctl_requests_total") == 1
    delta = metrics_delta(merge_metrics(before), text)
    assert delta is not None
    assert delta["counters"] == {'specctl_requests_total{instance="decode",status="length"}': 5.0,
                                 'specctl_requests_total{instance="decode.1",status="length"}': 1.0,
                                 'x_total{instance="router"}': 4.0}
    assert sglang_metrics(text) == {"num_queue_reqs": 3.0}
    assert merge_metrics({"decode": None}) is None


def _decode_info(accept: float, fp: str, switches: list[dict[str, object]], per_steps: dict[str, int],
                 step_s: float) -> dict[str, object]:
    return {"internal_states": [{"avg_spec_accept_length": accept}],
            "fingerprints": {"target": {"hash": "t"}, "registration": fp},
            "adaptive": {"mode": "adaptive", "switches": switches, "batches_per_steps": per_steps},
            "timing": {"mean_step_s": step_s}}


def test_two_decodes_merge_into_one_server_info() -> None:
    s1 = {"time": 10.0, "bucket": 1, "from_steps": 3, "to_steps": 1, "ema": 0.5}
    s2 = {"time": 5.0, "bucket": 1, "from_steps": 3, "to_steps": 5, "ema": 0.9}
    infos = {"prefill": {"fingerprints": {"registration": "pp"}, "internal_states": [{"avg_spec_accept_length": 9}]},
             "decode": _decode_info(2.0, "fp", [s1], {"1": 4, "3": 1}, 0.004),
             "decode.1": _decode_info(3.0, "fp", [s2], {"3": 2}, 0.006)}
    merged = merge_server_info(infos)
    assert si.server_accept_length(merged) == 2.5  # prefill never speculates: not in the mean
    assert si.fingerprint(merged) == "fp"
    assert si.batches_per_steps({}, merged) == {"1": 4, "3": 3}
    assert si.time_per_step(merged) == 5.0
    switches = si.adaptive_switches(None, merged)
    assert switches is not None and [s["to_steps"] for s in switches] == [5, 1]  # time order over instances
    assert [s["instance"] for s in merged["adaptive"]["switches"]] == ["decode.1", "decode"]  # type: ignore[index]
    infos["decode.1"] = _decode_info(3.0, "other", [], {}, 0.006)
    assert si.fingerprint(merge_server_info(infos)) == "decode=fp,decode.1=other"
    one = merge_server_info({"decode": infos["decode"], "decode.1": None})
    assert one is not None and si.fingerprint(one) == "fp" and si.server_accept_length(one) == 2.0
    assert merge_server_info({"decode": None}) is None


def test_bench_of_tiny_pd_reads_the_roles_behind_the_router(tmp_path: Path) -> None:
    dep = yaml.safe_load((ROOT / "presets" / "tiny-pd.yaml").read_text())
    router, prefill, boot, decode = free_ports(4)
    dep["roles"] = {"prefill": {"host": "127.0.0.1", "port": prefill, "bootstrap_port": boot},
                    "decode": {"host": "127.0.0.1", "port": decode},
                    "router": {"host": "127.0.0.1", "port": router}}
    path = tmp_path / "pd.yaml"
    path.write_text(yaml.safe_dump(dep))
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
    n = 6
    res = subprocess.run([sys.executable, "-m", "specctl.cli", "bench", "-c", str(path), "--dataset-name", "code",
                          "--num-prompts", str(n), "--random-output-len", "24", "--format", "json",
                          "--no-progress"], capture_output=True, text=True, env=env, timeout=300, cwd=tmp_path)
    assert res.returncode == 0, res.stderr[-3000:]
    (rec,) = [json.loads(line) for line in res.stdout.splitlines() if line.strip()]
    assert rec["completed"] == n and rec["url"] == f"http://127.0.0.1:{router}"  # the load went to the router
    fp = rec["fingerprint"]
    assert isinstance(fp, str) and len(fp) == 16 and int(fp, 16) >= 0, fp  # decode's registration fingerprint
    counters = rec["server_metrics"]["counters"]
    done = sum(v for k, v in counters.items() if k.startswith("specctl_requests_total{") and 'instance="decode"' in k)
    assert done == n, counters
    # Server-side verify steps == the verify steps the client counted from every response's usage.
    verifies = counters['specctl_spec_verify_steps_total{instance="decode",model_name="builtin:tiny-hybrid"}']
    assert verifies == sum(rec["accepted_per_step_histogram"].values()) > 0
    prefilled = [v for k, v in counters.items() if 'instance="prefill"' in k and 'status="prefilled"' in k]
    assert prefilled == [n], counters
    adaptive = rec["adaptive"]
    assert adaptive is not None and isinstance(adaptive["switches"], list)
    assert sum(adaptive["batches_per_steps"].values()) > 0 and adaptive["state"]["mode"] is not None


def test_bench_of_a_router_url_reads_the_workers_smg_lists(tmp_path: Path) -> None:
    """`bench --url ROUTER` (no deployment): smg lists its prefill and decode workers (`GET /workers`), and
    the snapshots read the decode's own /server_info through that list while the load goes to smg."""
    import signal
    import time

    router, prefill, boot, decode = free_ports(4)
    sets = [f"roles.router.port={router}", f"roles.prefill.port={prefill}", f"roles.prefill.bootstrap_port={boot}",
            f"roles.decode.port={decode}"]
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
    log = (tmp_path / "up.log").open("wb")
    up = subprocess.Popen([sys.executable, "-m", "specctl.cli", "up", "-c", "tiny-pd", "--log-dir", str(tmp_path),
                           *(a for s in sets for a in ("--set", s))], stdout=log, stderr=subprocess.STDOUT, env=env)
    try:
        deadline = time.monotonic() + 240
        while b"ready: http" not in (tmp_path / "up.log").read_bytes():
            assert up.poll() is None and time.monotonic() < deadline, (tmp_path / "up.log").read_text()[-3000:]
            time.sleep(0.5)
        n = 4
        res = subprocess.run([sys.executable, "-m", "specctl.cli", "bench", "--url", f"http://127.0.0.1:{router}",
                              "--dataset-name", "code", "--num-prompts", str(n), "--random-output-len", "16",
                              "--format", "json", "--no-progress"],
                             capture_output=True, text=True, env=env, timeout=300, cwd=tmp_path)
    finally:
        up.send_signal(signal.SIGTERM)
        up.wait(60)
        log.close()
    assert res.returncode == 0, res.stderr[-3000:]
    (rec,) = [json.loads(line) for line in res.stdout.splitlines() if line.strip()]
    assert rec["completed"] == n and rec["url"] == f"http://127.0.0.1:{router}"
    fp = rec["fingerprint"]
    assert isinstance(fp, str) and len(fp) == 16, fp  # the decode's registration fingerprint, not the prefill's
    adaptive = rec["adaptive"]
    assert adaptive is not None and sum(adaptive["batches_per_steps"].values()) > 0  # only decode counts these
    counters = rec["server_metrics"]["counters"]
    assert any('instance="decode"' in k for k in counters), counters
