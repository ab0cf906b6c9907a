"""The one router command line (orchestrate/router.py `router_command`) for both kinds, checked by each
router's own argument parser (smg's and sglang-router's `parse_router_args`, the code their binaries run):
every prefill with its bootstrap port, every decode, host, port, the request timeout, and for smg the
slow-client bounds under SLOW_CLIENT_BOUND_S. `up` (router_argv) and `export sglang` use the same builder."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import pytest
from validate_helpers import run_cli

from specctl.errors import UsageError
from specctl.orchestrate.router import router_argv
from specctl.schemas.sglang.router import DEFAULT_ROUTER_KIND, SLOW_CLIENT_BOUND_S, router_command
from specctl.schemas.validator import load_deployment

PREFILLS: list[tuple[str, int | None]] = [("http://10.0.0.1:30001", 8998), ("http://10.0.0.2:30001", None)]
DECODES = ["http://10.0.0.3:30002", "http://10.0.0.4:30002"]


def parsed(argv: list[str]) -> Any:
    """The RouterArgs the router's own launcher builds from argv (its module prefix stripped)."""
    if "smg" in argv[:3]:
        from smg.launch_router import parse_router_args

        return parse_router_args(argv[argv.index("launch") + 1:])
    from sglang_router.launch_router import parse_router_args as parse_sglang_router

    assert argv[1:3] == ["-m", "sglang_router.launch_router"]
    return parse_sglang_router(argv[3:])


@pytest.mark.parametrize("kind", ["smg", "sglang-router"])
def test_each_router_parses_the_command_into_the_same_topology(kind: str) -> None:
    argv = router_command(PREFILLS, DECODES, kind=kind, host="0.0.0.0", port=8000, request_timeout_s=700)
    args = parsed(argv)
    assert args.pd_disaggregation is True
    assert args.prefill_urls == PREFILLS and args.decode_urls == DECODES
    assert (args.host, args.port, args.request_timeout_secs) == ("0.0.0.0", 8000, 700)


def test_smg_closes_slow_clients_within_the_bound_and_is_the_default() -> None:
    assert DEFAULT_ROUTER_KIND == "smg"
    argv = router_command(PREFILLS, DECODES)
    assert argv[:3] == ["smg", "launch", "--pd-disaggregation"]
    args = parsed(argv)
    bounds = (args.header_read_timeout_secs, args.idle_connection_timeout_secs, args.stream_body_stall_timeout_secs)
    assert all(0 < b < SLOW_CLIENT_BOUND_S for b in bounds), bounds  # 0 would disable a bound


def test_smg_answers_to_sglangs_default_model_name() -> None:
    assert parsed(router_command(PREFILLS, DECODES, served_model="m")).model_aliases == {"default": "m"}
    assert "--model-alias" not in router_command(PREFILLS, DECODES, served_model="default")
    assert "--model-alias" not in router_command(PREFILLS, DECODES, kind="sglang-router", served_model="m")


def test_a_python_runs_the_router_as_its_module() -> None:
    assert router_command(PREFILLS, DECODES, python="/x/python")[:4] == ["/x/python", "-m", "smg", "launch"]
    argv = router_command(PREFILLS, DECODES, kind="sglang-router", python="/x/python")
    assert argv[:3] == ["/x/python", "-m", "sglang_router.launch_router"]
    assert router_command(PREFILLS, DECODES, extra=["--policy", "round_robin"])[-2:] == ["--policy", "round_robin"]


def test_an_unknown_kind_or_a_half_pair_is_a_usage_error() -> None:
    with pytest.raises(UsageError, match="smg.*sglang-router"):
        router_command(PREFILLS, DECODES, kind="nginx")
    with pytest.raises(UsageError, match="prefill and one decode"):
        router_command([], DECODES)


def _deployment(tmp_path: Path, kind: str | None) -> Path:
    text = Path("presets/tiny-pd.yaml").read_text(encoding="utf-8")
    if kind is not None:
        old = "router: {host: 127.0.0.1, port: 30000}"
        text = text.replace(old, f"router: {{host: 127.0.0.1, port: 30000, kind: {kind}}}")
    path = tmp_path / "d.yaml"
    path.write_text(text, encoding="utf-8")
    return path


@pytest.mark.parametrize("kind", [None, "smg", "sglang-router"])
def test_the_deployment_picks_the_router_of_up_and_of_the_export(tmp_path: Path, kind: str | None) -> None:
    path = _deployment(tmp_path, kind)
    up = router_argv(load_deployment(path), python=sys.executable)
    result = run_cli("export", "sglang", "-c", str(path), "--format", "json")
    assert result.exit_code == 0, result.output
    exported = json.loads(result.stdout)["router"]
    for argv in (up, exported):
        args = parsed(argv)
        assert args.prefill_urls == [("http://127.0.0.1:30001", 8998)]
        assert args.decode_urls == ["http://127.0.0.1:30002"]
    assert ("smg" in up[:3]) == (kind != "sglang-router") == ("smg" in exported[:3])
    if kind != "sglang-router":  # smg routes by model id: SGLang's default name reaches the served model
        assert parsed(up).model_aliases == {"default": "builtin:tiny-hybrid"}
        assert Path(parsed(exported).model_aliases["default"], "config.json").is_file()  # the directory SGLang loads


def test_a_router_kind_outside_the_schema_is_refused_naming_the_field(tmp_path: Path) -> None:
    result = run_cli("validate", str(_deployment(tmp_path, "nginx")))
    assert result.exit_code == 1, result.output
    assert "kind" in result.output and "sglang-router" in result.output
