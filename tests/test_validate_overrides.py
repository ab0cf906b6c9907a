"""`--set a.b.c=value` overrides (helm-style), the merged role view and `load_deployment`."""

from __future__ import annotations

from pathlib import Path

import pytest
from validate_helpers import run_cli, run_json

from specctl.errors import InvalidInput, UsageError
from specctl.schemas.deployment import DEFAULTS, load_deployment
from specctl.schemas.overrides import apply_overrides, parse_override


def test_values_parse_as_yaml_scalars() -> None:
    assert parse_override("speculative.num_steps=5").value == 5
    assert parse_override("model.dtype=bfloat16").value == "bfloat16"
    assert parse_override("a.b=true").value is True
    assert parse_override("a.b=null").value is None
    assert parse_override("a.b='5'").value == "5"
    assert parse_override("a.b=").value is None
    assert parse_override("serve.graph_batch_sizes=[1, 2, 4]").value == [1, 2, 4]
    assert parse_override("a.b=x=y").value == "x=y"
    ov = parse_override("speculative.adaptive.buckets.8.candidate_steps=[0,1]")
    assert ov.keys == ("speculative", "adaptive", "buckets", "8", "candidate_steps")
    assert parse_override(r"a\.b.c=1").keys == ("a.b", "c")
    assert parse_override("serve.graph_batch_sizes[1]=3").keys == ("serve", "graph_batch_sizes", 1)


def test_apply_creates_missing_mappings_and_never_mutates() -> None:
    data = {"model": {"target": "x"}, "serve": {"graph_batch_sizes": [1, 2]}}
    out = apply_overrides(data, ["speculative.adaptive.buckets.8.candidate_steps=[0, 1]",
                                 "serve.graph_batch_sizes[1]=4", "model.target=y"])
    assert out["speculative"] == {"adaptive": {"buckets": {"8": {"candidate_steps": [0, 1]}}}}
    assert out["serve"]["graph_batch_sizes"] == [1, 4]
    assert out["model"]["target"] == "y"
    assert data == {"model": {"target": "x"}, "serve": {"graph_batch_sizes": [1, 2]}}


@pytest.mark.parametrize("bad", ["novalue", "=3", "a..b=1", "a.b[x]=1", "model.target.x=1",
                                 "serve.graph_batch_sizes[9]=1",
                                 "a=[1, 2", "a=*x"])
def test_bad_override_is_a_usage_error(bad: str) -> None:
    with pytest.raises(UsageError) as exc:
        apply_overrides({"model": {"target": "x"}, "serve": {"graph_batch_sizes": [1]}}, [bad])
    assert "--set" in str(exc.value)


def test_set_on_the_cli_changes_findings_and_drops_the_line() -> None:
    code, doc = run_json("tiny-pd", "--set", "speculative.num_steps=4")  # no bucket selects 4
    assert code == 1
    [f] = [f for f in doc["files"][0]["findings"] if f["severity"] == "error"]
    assert (f["code"], f["path"], f["line"]) == ("ADP101", "$.speculative.num_steps", None)
    code, doc = run_json("tiny-pd", "--set", "speculative.num_steps=5")
    assert code == 0
    result = run_cli("validate", "tiny-pd", "--set", "oops")
    assert result.exit_code == 2 and result.stdout == ""
    assert "expected KEY=VALUE" in result.stderr and "Traceback" not in result.stderr


def test_load_deployment_merges_roles_and_fills_defaults(tmp_path: Path) -> None:
    dep = load_deployment("tiny-pd", overrides=["roles.decode.serve.max_batch_size=4"])
    assert dep.roles == ("prefill", "decode", "router")
    decode, prefill = dep.role("decode"), dep.role("prefill")
    assert decode.serve.max_batch_size == 4 and prefill.serve.max_batch_size == 8
    assert decode.speculative.adaptive is not None
    assert decode.speculative.adaptive["buckets"]["8"]["candidate_steps"] == [0, 1]
    assert decode.speculative.topk == 1 and decode.transfer.backend == "zmq"
    assert prefill.bootstrap_port == 8998 and decode.bootstrap_port is None
    assert (decode.host, decode.port) == ("127.0.0.1", 30002)
    assert decode.to_json()["serve"]["max_batch_size"] == 4  # the merged dict it was read from
    with pytest.raises(UsageError):
        dep.role("colocated")
    # a role's buckets replace the whole table (so a role can drop a bucket)
    one_bucket = "roles.decode.speculative.adaptive.buckets={1: {candidate_steps: [0, 3]}}"
    dep = load_deployment("tiny-pd", overrides=[one_bucket])
    assert list(dep.role("decode").to_json()["speculative"]["adaptive"]["buckets"]) == ["1"]
    assert list(dep.role("prefill").to_json()["speculative"]["adaptive"]["buckets"]) == ["1", "4", "8"]


def test_load_deployment_colocated_default_and_errors(tmp_path: Path) -> None:
    p = tmp_path / "d.yaml"
    p.write_text("version: 1\nmodel: {target: builtin:tiny-hybrid}\nspeculative: {algorithm: ngram}\n")
    dep = load_deployment(p)
    assert dep.roles == ("colocated",) and dep.name == "d"
    role = dep.role("colocated")
    assert (role.host, role.port) == ("127.0.0.1", 30000)
    assert role.speculative.num_steps == 3 and role.to_json()["cache"] == DEFAULTS["cache"]
    cache = DEFAULTS["cache"]
    assert (role.cache.page_size, role.cache.max_tokens) == (cache["page_size"], cache["max_tokens"])
    with pytest.raises(InvalidInput) as exc:
        load_deployment(p, overrides=["cache.state_types=[swa]"])
    assert exc.value.exit_code == 1
    assert [f.code for f in exc.value.findings] == ["PD510"]  # type: ignore[attr-defined]
    with pytest.raises(UsageError) as exc2:
        load_deployment("no-such-preset")
    assert "tiny-pd" in exc2.value.hint


def test_schema_defaults_match_the_merge_defaults() -> None:
    from specctl.schemas.validator import schema

    defs = schema()["$defs"]
    for section, defaults in DEFAULTS.items():
        props = defs[section]["properties"]
        for key, value in defaults.items():
            if key in ("draft", "adaptive", "graph_batch_sizes"):
                continue  # no schema default: absent means none / no padding
            if key == "ngram":
                assert {k: v["default"] for k, v in props["ngram"]["properties"].items()} == value
                continue
            assert props[key]["default"] == value, (section, key)
