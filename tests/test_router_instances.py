"""Several prefill and decode instances behind one sglang-router: the deployment file (schema, instances,
topology rules over every instance) and the router's command line over all of them. The topology itself
runs end to end in tests/test_serve_pd.py (2 prefill + 2 decode through `specctl up`)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from specctl.orchestrate.launcher import Launcher
from specctl.orchestrate.router import router_argv
from specctl.schemas.deployment import load_deployment
from specctl.schemas.validator import Validator

BASE = """version: 1
name: multi
model: {{target: builtin:tiny-hybrid, dtype: float32, device: cpu}}
speculative: {{algorithm: none}}
roles:
  prefill:
{prefill}
  decode:
{decode}
  router: {{host: 127.0.0.1, port: 32900}}
"""
PREFILLS = "    - {host: 127.0.0.1, port: 32901, bootstrap_port: 32911}\n" \
           "    - {host: 127.0.0.1, port: 32902, bootstrap_port: 32912, cache: {max_tokens: 4096}}"
DECODES = "    - {host: 127.0.0.1, port: 32903}\n    - {host: 127.0.0.1, port: 32904}"


def _file(tmp_path: Path, prefill: str = PREFILLS, decode: str = DECODES) -> Path:
    path = tmp_path / "multi.yaml"
    path.write_text(BASE.format(prefill=prefill, decode=decode))
    return path


def _findings(path: Path) -> list[tuple[str, str]]:
    report = Validator().validate_paths([path])
    return [(f.code, f.path) for r in report.files for f in r.findings if f.severity == "error"]


def test_instance_lists_validate_and_merge_per_instance(tmp_path: Path) -> None:
    path = _file(tmp_path)
    assert _findings(path) == []
    dep = load_deployment(path)
    pre = dep.instances("prefill")
    assert [(p.port, p.bootstrap_port) for p in pre] == [(32901, 32911), (32902, 32912)]
    assert pre[1].cache.max_tokens == 4096 and pre[0].cache.max_tokens != 4096  # own overrides
    assert pre[0].model == pre[1].model  # the top-level sections under each
    assert [d.port for d in dep.instances("decode")] == [32903, 32904]
    assert dep.role("prefill").port == 32901  # the rules' view: instance 0
    assert dep.instances("router") == [dep.role("router")]


def test_the_router_fronts_every_instance_and_the_launcher_starts_each(tmp_path: Path) -> None:
    dep = load_deployment(_file(tmp_path))
    argv = router_argv(dep, python=sys.executable)
    pairs = [argv[i + 1:i + 3] for i, a in enumerate(argv) if a == "--prefill"]
    assert pairs == [["http://127.0.0.1:32901", "32911"], ["http://127.0.0.1:32902", "32912"]]
    assert [argv[i + 1] for i, a in enumerate(argv) if a == "--decode"] == ["http://127.0.0.1:32903",
                                                                            "http://127.0.0.1:32904"]
    la = Launcher(dep, log_dir=tmp_path / "logs")
    assert la.names == ("prefill", "prefill.1", "decode", "decode.1", "router")
    cmd = la.command("decode.1")
    assert cmd[cmd.index("--role") + 1] == "decode" and cmd[cmd.index("--instance") + 1] == "1"
    assert "--instance" not in la.command("prefill")
    ports = {(key, what): port for key, what, _, port in la.planned_ports()}
    assert ports[("prefill.1", "bootstrap_port")] == 32912 and ports[("decode.1", "port")] == 32904


@pytest.mark.parametrize(("prefill", "decode", "code", "path"), [
    (PREFILLS, "    - {host: 127.0.0.1, port: 32903}\n    - {host: 127.0.0.1, port: 32912}", "TOP601",
     "$.roles.decode[1].port"),
    ("    - {host: 127.0.0.1, port: 32901, bootstrap_port: 32911}\n    - {host: 127.0.0.1, port: 32902}", DECODES,
     "TOP603", "$.roles.prefill[1]"),
    (PREFILLS, "    - {host: gpu-node-2, port: 32903}", "TOP602", "$.roles.decode[0].host"),
])
def test_topology_rules_cover_every_instance(tmp_path: Path, prefill: str, decode: str, code: str,
                                             path: str) -> None:
    assert (code, path) in _findings(_file(tmp_path, prefill, decode))


@pytest.mark.parametrize("decode", ["    []", "    - 3", "    - {host: 127.0.0.1, port: 32903, bogus: 1}"])
def test_a_malformed_instance_list_is_a_schema_error(tmp_path: Path, decode: str) -> None:
    found = _findings(_file(tmp_path, decode=decode))
    assert found and all(c.startswith("SCH") for c, _ in found), found


def test_the_router_metrics_port_is_a_listener_and_reaches_sglang_router(tmp_path: Path) -> None:
    """roles.router.metrics_port: validated like every listener (a clash is TOP601 at its path) and passed to
    sglang-router as --prometheus-port."""
    path = tmp_path / "m.yaml"
    path.write_text(BASE.format(prefill=PREFILLS, decode=DECODES).replace(
        "router: {host: 127.0.0.1, port: 32900}", "router: {host: 127.0.0.1, port: 32900, metrics_port: 32901}"))
    assert ("TOP601", "$.roles.router.metrics_port") in _findings(path)
    path.write_text(path.read_text().replace("metrics_port: 32901", "metrics_port: 32990"))
    assert _findings(path) == []
    argv = router_argv(load_deployment(path), python=sys.executable)
    assert argv[argv.index("--prometheus-port") + 1] == "32990"
