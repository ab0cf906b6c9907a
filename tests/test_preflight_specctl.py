"""`specctl preflight` against REAL running specctl servers (today's specctl `/server_info` shape).

One module-scoped set of `specctl serve` processes, all started at once on free ports: a base
colocated server, one colocated variant per field a specctl server can express (each differs from
the base only there), and a matched prefill + decode pair. A matched pair passes; every variant
against the base is refused with exactly its field(s) in the diff.
"""

from __future__ import annotations

import json
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest
from typer.testing import CliRunner

from specctl.cli.main import app
from specctl.engine.checkpoint import write_random_model
from specctl.orchestrate.ports import free_port, free_ports
from specctl.preflight.check import run_preflight

from test_serve_pd import Proc  # isort: skip  (one `specctl serve` process helper for the PD tests)

pytestmark = pytest.mark.slow

START_TIMEOUT = 180.0
runner = CliRunner()


def healthy(url: str) -> bool:
    try:
        with urllib.request.urlopen(url + "/health", timeout=2) as r:  # noqa: S310 - loopback
            return bool(r.status == 200)
    except (urllib.error.URLError, OSError):
        return False


def write_deployment(path: Path, *, target: Path, draft: Path, roles: str) -> Path:
    path.write_text(f"""version: 1
name: {path.stem}
model: {{target: {target}, dtype: float32, device: cpu}}
speculative:
  algorithm: draft
  draft: {draft}
  num_steps: 1
  adaptive:
    buckets:
      1: {{candidate_steps: [1, 2]}}
cache: {{page_size: 4, max_tokens: 1024}}
serve: {{max_batch_size: 4}}
transfer: {{backend: zmq, timeout_s: 10}}
roles:
{roles}""")
    return path


# name -> (--set overrides on the base colocated server, fields the diff must name)
VARIANTS: dict[str, tuple[tuple[str, ...], set[str]]] = {
    "page_size": (("cache.page_size=8",), {"page_size"}),
    "dtype": (("model.dtype=bfloat16",), {"dtype", "kv_cache_dtype"}),
    "algorithm": (("speculative.algorithm=ngram", "speculative.draft=null"),
                  {"speculative_algorithm", "draft_model"}),
    "draft_model": (("speculative.draft={draft2}",), {"draft_model"}),
    "adaptive_one_side": (("speculative.adaptive=null",), {"adaptive", "adaptive_config"}),
    "state_types": (("model.target={full}",), {"model_path", "state_types"}),
    "transfer_backend": (("transfer.backend=shm",), {"transfer_backend"}),
}


@pytest.fixture(scope="module")
def servers(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, str]]:
    root = tmp_path_factory.mktemp("preflight")
    models = {"target": write_random_model(root / "target"),  # mamba, swa, full, swa
              "full": write_random_model(root / "full", layer_kinds=("full", "full")),
              "draft": write_random_model(root / "draft", layer_kinds=("full",), seed=1),
              "draft2": write_random_model(root / "draft2", layer_kinds=("full",), seed=2)}
    ports = dict(zip(("colocated", "prefill", "bootstrap", "decode"), free_ports(4), strict=True))
    cfg = write_deployment(root / "pd.yaml", target=models["target"], draft=models["draft"], roles=(
        f"  prefill: {{host: 127.0.0.1, port: {ports['prefill']}, bootstrap_port: {ports['bootstrap']}}}\n"
        f"  decode: {{host: 127.0.0.1, port: {ports['decode']}}}\n"))
    colo = write_deployment(root / "colocated.yaml", target=models["target"], draft=models["draft"],
                            roles=f"  colocated: {{host: 127.0.0.1, port: {ports['colocated']}}}\n")
    procs: dict[str, Proc] = {}
    urls: dict[str, str] = {"cfg": str(cfg)}
    try:
        procs["base"] = Proc("colocated", colo, root / "base.log")
        urls["base"] = f"http://127.0.0.1:{ports['colocated']}"
        for name, (sets, _) in VARIANTS.items():
            port = free_port()
            filled = tuple(s.format(**{k: str(v) for k, v in models.items()}) for s in sets)
            procs[name] = Proc("colocated", colo, root / f"{name}.log", sets=(f"roles.colocated.port={port}", *filled))
            urls[name] = f"http://127.0.0.1:{port}"
        procs["prefill"] = Proc("prefill", cfg, root / "prefill.log")
        procs["decode"] = Proc("decode", cfg, root / "decode.log")
        urls["prefill"] = f"http://127.0.0.1:{ports['prefill']}"
        urls["decode"] = f"http://127.0.0.1:{ports['decode']}"
        deadline = time.monotonic() + START_TIMEOUT
        pending = {n for n in procs}
        while pending:
            for n in list(pending):
                if healthy(urls[n]):
                    pending.discard(n)
                elif procs[n].p.poll() is not None:
                    raise AssertionError(f"{n} exited {procs[n].p.returncode}: {procs[n].log.read_text()[-2000:]}")
            if time.monotonic() > deadline:
                raise AssertionError(f"not ready after {START_TIMEOUT}s: {sorted(pending)}")
            time.sleep(0.2)
        yield urls
    finally:
        for p in procs.values():
            if p.p.poll() is None:
                p.p.terminate()
        for p in procs.values():
            p.stop()


def test_matched_colocated_servers_pass(servers: dict[str, str]) -> None:
    report = run_preflight(servers["base"], servers["base"], timeout_s=5)
    assert report.ok, [d.to_json() for d in report.differences]
    p = report.prefill
    assert (p.shape, p.engine, p.page_size, p.speculative_algorithm, p.adaptive) == ("sglang", "specctl", 4,
                                                                                     "draft", True)
    assert p.state_types == ("mamba", "swa") and p.state_types_source == "reported"


def test_matched_pd_pair_passes(servers: dict[str, str]) -> None:
    res = runner.invoke(app, ["preflight", "--prefill", servers["prefill"], "--decode", servers["decode"],
                              "-c", servers["cfg"], "--format", "json"])
    assert res.exit_code == 0, res.output
    doc = json.loads(res.stdout)
    assert doc["ok"] and doc["differences"] == [] and doc["deployment_differences"] == []
    assert (doc["prefill"]["role"], doc["decode"]["role"]) == ("prefill", "decode")
    assert doc["prefill"]["state_types"] == ["mamba", "swa"]
    assert doc["prefill"]["reported_fingerprint"] == doc["decode"]["reported_fingerprint"]  # the handshake's
    assert doc["fingerprints"]["prefill"] == doc["fingerprints"]["decode"]
    assert any("specctl's handshake" in n for n in doc["notes"])


def test_pd_prefill_and_colocated_base_agree(servers: dict[str, str]) -> None:
    # Same deployment, different process kinds and /server_info sub-shapes (registration vs fingerprints).
    report = run_preflight(servers["prefill"], servers["base"], timeout_s=5)
    assert report.ok, [d.to_json() for d in report.differences]


@pytest.mark.parametrize("variant", list(VARIANTS))
def test_a_pair_differing_in_one_field_is_refused_with_that_field(servers: dict[str, str], variant: str) -> None:
    expected = VARIANTS[variant][1]
    report = run_preflight(servers["base"], servers[variant], timeout_s=5)
    assert {d.field for d in report.differences} == expected
    assert not report.ok


def test_cli_refuses_a_mismatch_against_the_pd_prefill_with_exit_3(servers: dict[str, str]) -> None:
    res = runner.invoke(app, ["preflight", "--prefill", servers["prefill"], "--decode", servers["page_size"]])
    assert res.exit_code == 3
    out = " ".join(res.output.split())
    assert "page_size" in out and "preflight refused the pair: 1 difference(s)" in out and "Traceback" not in out


def test_servers_compared_with_what_the_deployment_asked(servers: dict[str, str]) -> None:
    res = runner.invoke(app, ["preflight", "--prefill", servers["prefill"], "--decode", servers["decode"],
                              "-c", servers["cfg"], "--set", "cache.page_size=16", "--format", "json"])
    assert res.exit_code == 3, res.output
    rows = json.loads(res.stdout)["deployment_differences"]
    drift = {(r["role"], r["field"], r["asked"], r["running"]) for r in rows}
    assert drift == {("prefill", "page_size", 16, 4), ("decode", "page_size", 16, 4)}


def test_bench_of_a_launched_deployment_binds_the_pair_preflight(servers: dict[str, str]) -> None:
    # `specctl bench -c` calls this once the launched deployment is ready; here the running pair is it.
    from specctl.bench.target import preflight_of
    from specctl.schemas.validator import load_deployment

    got = preflight_of(load_deployment(servers["cfg"]))
    assert got is not None and got["ok"] is True
    report = run_preflight(servers["prefill"], servers["decode"], timeout_s=5)
    assert got == {"ok": True, **report.fingerprints()}
    assert preflight_of(load_deployment("tiny-colocated")) is None  # no PD pair: nothing to bind


def test_preflight_finds_the_pair_from_the_deployment_roles(servers: dict[str, str]) -> None:
    res = runner.invoke(app, ["preflight", "-c", servers["cfg"], "--format", "json"])
    assert res.exit_code == 0, res.output
    doc = json.loads(res.stdout)
    assert (doc["prefill"]["url"], doc["decode"]["url"]) == (servers["prefill"], servers["decode"])
    assert doc["bootstrap_route"] is None  # engine: builtin -- its bootstrap is the ZeroMQ handshake
