"""Adaptive config model, routing, bucket sanity (ADP2xx) and step coverage (ADP1xx).

Example folders under tests/data/adaptive drive the rule tests; routing and coverage are checked
against a brute-force oracle that walks every batch size.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st

from specctl.schemas import catalog
from specctl.schemas.adaptive import (
    KNOB_DEFAULTS,
    Knobs,
    check_deployment_steps,
    looks_like_sglang_adaptive,
    pad_batch_size,
    parse_deployment_adaptive,
    parse_sglang_config,
    sglang_default_config,
    step_coverage,
)

DATA = Path(__file__).parent / "data" / "adaptive"
SGLANG_VALID = sorted((DATA / "sglang" / "valid").glob("*.json"))
SGLANG_INVALID = json.loads((DATA / "sglang" / "invalid" / "expected.json").read_text())
DEPLOY_VALID = sorted((DATA / "deployment" / "valid").glob("*.yaml"))
DEPLOY_INVALID = json.loads((DATA / "deployment" / "invalid" / "expected.json").read_text())


def sglang_findings(path: Path, opts: dict) -> list:
    cfg, findings = parse_sglang_config(json.loads(path.read_text()))
    if cfg is not None:
        _, more = step_coverage(
            cfg,
            initial_steps=opts.get("initial_steps"),
            graph_batch_sizes=opts.get("graph_batch_sizes", ()),
            max_batch_size=opts.get("max_batch_size"),
        )
        findings += more
    return findings


def deployment_findings(path: Path) -> list:
    role = yaml.safe_load(path.read_text())
    _, findings = check_deployment_steps(role, engine=role.get("engine", "builtin"))
    return findings


def adp_codes() -> set[str]:
    return {c for c in catalog.all_rules() if c.startswith("ADP")}


# -- example folders -------------------------------------------------------------------------------


@pytest.mark.parametrize("path", SGLANG_VALID, ids=lambda p: p.name)
def test_valid_sglang_files_have_no_problems(path: Path) -> None:
    cfg, findings = parse_sglang_config(json.loads(path.read_text()))
    assert cfg is not None
    _, more = step_coverage(cfg, initial_steps=cfg.default_initial_steps, graph_batch_sizes=(1, 2, 4, 8))
    assert [f for f in findings + more if f.severity != "info"] == []


@pytest.mark.parametrize("name", sorted(SGLANG_INVALID), ids=str)
def test_invalid_sglang_files_report_code_and_path(name: str) -> None:
    spec = SGLANG_INVALID[name]
    findings = sglang_findings(DATA / "sglang" / "invalid" / name, spec)
    got = {(f.code, f.path) for f in findings}
    for code, path in spec["findings"]:
        assert (code, path) in got, (code, path, findings)
    # Each example exercises exactly the problems it names (infos aside), so it proves that rule alone.
    expected = {c for c, _ in spec["findings"]}
    assert {f.code for f in findings if f.severity != "info" or f.code in expected} == expected


@pytest.mark.parametrize("path", DEPLOY_VALID, ids=lambda p: p.name)
def test_valid_deployment_roles_have_no_problems(path: Path) -> None:
    coverage, findings = check_deployment_steps(yaml.safe_load(path.read_text()))
    assert coverage is not None
    assert findings == []


@pytest.mark.parametrize("name", sorted(DEPLOY_INVALID), ids=str)
def test_invalid_deployment_roles_report_code_and_path(name: str) -> None:
    findings = deployment_findings(DATA / "deployment" / "invalid" / name)
    assert {(f.code, f.path) for f in findings} >= {tuple(x) for x in DEPLOY_INVALID[name]}, findings


def test_every_adp_rule_has_a_failing_and_a_passing_example() -> None:
    failing = {c for spec in SGLANG_INVALID.values() for c, _ in spec["findings"]}
    failing |= {c for items in DEPLOY_INVALID.values() for c, _ in items}
    assert failing == adp_codes()
    passing: set[str] = set()
    for path in SGLANG_VALID:
        cfg, _ = parse_sglang_config(json.loads(path.read_text()))
        assert cfg is not None
        opts = {"initial_steps": cfg.default_initial_steps, "graph_batch_sizes": [1, 2, 4, 8], "max_batch_size": 64}
        passing |= {f.code for f in sglang_findings(path, opts)}
    for path in DEPLOY_VALID:
        passing |= {f.code for f in deployment_findings(path)}
    assert passing & adp_codes() == set()


def test_finding_severity_matches_the_catalog() -> None:
    rules = catalog.all_rules()
    seen = 0
    for name, spec in SGLANG_INVALID.items():
        for f in sglang_findings(DATA / "sglang" / "invalid" / name, spec):
            assert f.severity == rules[f.code].severity, f
            assert f.message and f.fix and f.path.startswith("$")
            seen += 1
    assert seen >= len(SGLANG_INVALID)


def test_catalog_registers_every_rule_with_text() -> None:
    assert "specctl.schemas.adaptive" in catalog.RULE_MODULES
    rules = catalog.all_rules()
    for code in adp_codes():
        doc = rules[code]
        assert doc.title and doc.summary and doc.runtime_error and doc.fix


# -- messages that name fields, values and the fix --------------------------------------------------


def test_initial_step_error_matches_sglang_and_names_the_fix() -> None:
    cfg = sglang_default_config()
    _, findings = step_coverage(cfg, initial_steps=2)
    (f,) = [f for f in findings if f.code == "ADP101"]
    assert "--speculative-num-steps=2 is not in the adaptive config candidate_steps [0, 1, 3, 5, 7]" in f.message
    assert f.fix.startswith("set --speculative-num-steps to one of [0, 1, 3, 5, 7]")
    assert 'add 2 to candidate_steps of bucket "1"' in f.fix


def test_misspellings_suggest_the_closest_knob() -> None:
    _, findings = parse_sglang_config({"ema_alfa": 0.3, "bs8": {"candidate_steps": [1]}, "1": {"candidate_steps": [1]}})
    by_code = {f.code: f for f in findings}
    assert 'did you mean "ema_alpha"' in by_code["ADP209"].message.lower()
    assert by_code["ADP209"].fix == 'rename "ema_alfa" to "ema_alpha"'
    assert 'did you mean "8"' in by_code["ADP206"].message and by_code["ADP206"].fix == 'rename the key to "8"'


def test_update_interval_zero_mentions_the_division() -> None:
    _, findings = parse_sglang_config({"update_interval": 0, "1": {"candidate_steps": [1]}})
    (f,) = findings
    assert f.code == "ADP211" and "ZeroDivisionError" in f.message and "update_interval is 0" in f.message


def test_bool_step_runs_as_one_like_sglang() -> None:
    cfg, findings = parse_sglang_config({"1": {"candidate_steps": [True, 3]}})
    assert cfg is not None and cfg.buckets[0].candidate_steps == (1, 3)
    assert [f.code for f in findings] == ["ADP204"]


# -- the config model -------------------------------------------------------------------------------


def test_sglang_default_facts() -> None:
    cfg = sglang_default_config()
    assert cfg.keys == (1, 8, 32, 64)
    assert cfg.union_steps == (0, 1, 3, 5, 7)
    assert cfg.default_initial_steps == 3
    assert cfg.bucket(1).knobs.down_hysteresis == -0.25
    assert cfg.bucket(8).knobs.down_hysteresis == 0.0
    assert cfg.bucket(64).candidate_steps == (0,)


def test_knobs_default_merge_and_bucket_override() -> None:
    cfg, findings = parse_sglang_config(
        {
            "ema_alpha": 0.3,
            "warmup_batches": 2,
            "1": {"candidate_steps": [3, 1]},
            "8": {"candidate_steps": [0], "ema_alpha": 0.5},
        }
    )
    assert findings == [] and cfg is not None
    one, eight = cfg.buckets
    assert one.candidate_steps == (1, 3)  # sorted like SGLang's slot
    assert one.knobs == Knobs(ema_alpha=0.3, warmup_batches=2)
    assert eight.knobs.ema_alpha == 0.5 and eight.knobs.warmup_batches == 2
    assert Knobs() == Knobs(**KNOB_DEFAULTS)


def test_deployment_knobs_merge_the_same_way() -> None:
    cfg, findings = parse_deployment_adaptive(
        {
            "ema_alpha": 0.3,
            "buckets": {"1": {"candidate_steps": [1, 3]}, "8": {"candidate_steps": [0, 1], "ema_alpha": 0.6}},
        }
    )
    assert findings == [] and cfg is not None
    assert [b.knobs.ema_alpha for b in cfg.buckets] == [0.3, 0.6]
    assert [b.path for b in cfg.buckets] == ["$.speculative.adaptive.buckets.1", "$.speculative.adaptive.buckets.8"]


def test_sglang_ignores_the_strategy_key() -> None:
    cfg, findings = parse_sglang_config({"strategy": "throughput_aware", "1": {"candidate_steps": [1, 3]}})
    assert cfg is not None and cfg.strategy == "ema"
    assert cfg.buckets[0].knobs.update_interval == 5
    assert [f.code for f in findings] == ["ADP222"]


def test_a_deployment_throughput_aware_keeps_its_interval_default() -> None:
    cfg, findings = parse_deployment_adaptive(
        {"strategy": "throughput_aware", "buckets": {1: {"candidate_steps": [1, 3]}}})
    assert cfg is not None and cfg.strategy == "throughput_aware"
    assert cfg.buckets[0].knobs.update_interval == 10
    assert [f.code for f in findings] == ["ADP216"]


@pytest.mark.parametrize(
    ("batch", "graphs", "expected"),
    [
        (1, (), 1), (7, (), 1), (8, (), 8), (31, (), 8), (32, (), 32), (1000, (), 64),
        (5, (1, 2, 4, 16), 8),  # padded to 16 -> largest key <= 16 is 8
        (4, (1, 2, 4, 16), 1),
        (16, (1, 2, 4, 16), 8),
        (17, (1, 2, 4, 16), 8),  # above every graph size: routed unpadded
        (20, (1, 2, 4, 16, 32), 32),  # padded to 32 lands in bucket 32
        (8, (8,), 8),
    ],
)
def test_route_with_and_without_padding(batch: int, graphs: tuple[int, ...], expected: int) -> None:
    assert sglang_default_config().route(batch, graphs).min_batch_size == expected


def test_route_below_the_smallest_key_takes_the_smallest_bucket() -> None:
    cfg, _ = parse_sglang_config({"4": {"candidate_steps": [1]}, "16": {"candidate_steps": [0]}})
    assert cfg is not None
    assert cfg.route(1).min_batch_size == 4
    assert cfg.route(3, (2,)).min_batch_size == 4  # no graph size >= 3: unpadded


def test_looks_like_sglang_adaptive() -> None:
    assert looks_like_sglang_adaptive({"1": {"candidate_steps": [1]}})
    assert looks_like_sglang_adaptive({"ema_alpha": 0.2})
    assert not looks_like_sglang_adaptive({"version": 1, "speculative": {}})
    assert not looks_like_sglang_adaptive([1, 2])
    assert not looks_like_sglang_adaptive({})


# -- coverage ---------------------------------------------------------------------------------------


def test_coverage_table_for_the_default_with_padding() -> None:
    cov, findings = step_coverage(
        sglang_default_config(), initial_steps=3, graph_batch_sizes=[1, 2, 4, 16], max_batch_size=48
    )
    rows = [(r.batch_min, r.batch_max, r.padded_size, r.bucket, r.steps) for r in cov.rows]
    assert rows == [
        (1, 1, 1, 1, (1, 3, 5, 7)),
        (2, 2, 2, 1, (1, 3, 5, 7)),
        (3, 4, 4, 1, (1, 3, 5, 7)),
        (5, 16, 16, 8, (0, 1, 3)),
        (17, 31, None, 8, (0, 1, 3)),
        (32, 48, None, 32, (0, 1)),
    ]
    assert cov.required_states == (0, 1, 3, 5, 7)
    assert cov.unreachable_buckets == (64,)
    assert dict(cov.graphs_by_step)[7] == (1, 2, 4) and dict(cov.graphs_by_step)[0] == (16,)
    assert [f.code for f in findings if f.severity != "info"] == ["ADP102"]
    text = cov.render_text()
    assert "batch size" in text and "5-16" in text and "prebuilt runtime states (steps): 0, 1, 3, 5, 7" in text
    assert json.loads(json.dumps(cov.to_json()))["rows"][3] == {
        "batch_min": 5, "batch_max": 16, "padded_size": 16, "bucket": 8, "steps": [0, 1, 3], "start_steps": 3,
    }


def test_unreachable_bucket_drops_its_only_steps_from_required_states() -> None:
    cfg, _ = parse_sglang_config(
        {"1": {"candidate_steps": [1, 3]}, "8": {"candidate_steps": [0, 5]}, "16": {"candidate_steps": [0, 1]}}
    )
    assert cfg is not None
    cov, findings = step_coverage(cfg, initial_steps=3, graph_batch_sizes=[1, 2, 4, 16])
    assert 5 not in cov.required_states and cov.required_states == (0, 1, 3)
    (f,) = [f for f in findings if f.code == "ADP103"]
    assert "[5]" in f.message and "batch sizes 8..15 pad to graph size(s) [16]" in f.message
    assert f.fix == 'add 8 to --cuda-graph-bs (any size in 8..15 works), or remove bucket "8"'


def test_initial_steps_only_in_an_unreachable_bucket_is_still_built() -> None:
    cfg, _ = parse_sglang_config({"1": {"candidate_steps": [1, 3]}, "64": {"candidate_steps": [0, 5]}})
    assert cfg is not None
    cov, findings = step_coverage(cfg, initial_steps=5, max_batch_size=8)
    assert 5 in cov.required_states and "ADP101" not in {f.code for f in findings}


def test_fixed_steps_and_no_speculation_coverage() -> None:
    serve = {"max_batch_size": 8, "graph_batch_sizes": [1, 4]}
    role = {"speculative": {"algorithm": "draft", "num_steps": 4}, "serve": serve}
    cov, findings = check_deployment_steps(role)
    assert findings == [] and cov is not None and not cov.adaptive
    assert cov.required_states == (4,) and [(r.batch_min, r.batch_max, r.padded_size) for r in cov.rows] == [
        (1, 1, 1), (2, 4, 4), (5, 8, None),
    ]
    cov, _ = check_deployment_steps({"speculative": {"algorithm": "none"}, "serve": {"max_batch_size": 8}})
    assert cov is not None and cov.required_states == (0,)


def test_role_override_paths() -> None:
    adaptive = {"buckets": {"1": {"candidate_steps": [1]}}}
    role = {"speculative": {"algorithm": "draft", "num_steps": 2, "adaptive": adaptive}}
    _, findings = check_deployment_steps(
        role, adaptive_path="$.roles.decode.speculative.adaptive", num_steps_path="$.roles.decode.speculative.num_steps"
    )
    assert [(f.code, f.path) for f in findings] == [("ADP101", "$.roles.decode.speculative.num_steps")]
    assert findings[0].message.startswith("speculative.num_steps=2 is not in the adaptive config candidate_steps [1]")
    assert findings[0].fix.startswith("set speculative.num_steps to one of [1]")


def brute_route(keys: list[int], graphs: list[int], bs: int) -> int:
    padded = min((g for g in graphs if g >= bs), default=bs)
    below = [k for k in keys if k <= padded]
    return max(below) if below else min(keys)


bucket_maps = st.dictionaries(
    st.integers(1, 40), st.lists(st.integers(0, 8), min_size=1, max_size=4), min_size=1, max_size=5
)


@settings(max_examples=150, deadline=None)
@given(
    buckets=bucket_maps,
    graphs=st.lists(st.integers(1, 48), max_size=6),
    max_bs=st.one_of(st.none(), st.integers(1, 60)),
    initial=st.integers(0, 8),
)
def test_coverage_matches_brute_force(buckets: dict, graphs: list[int], max_bs: int | None, initial: int) -> None:
    cfg, _ = parse_sglang_config({str(k): {"candidate_steps": v} for k, v in buckets.items()})
    assert cfg is not None
    cov, findings = step_coverage(cfg, initial_steps=initial, graph_batch_sizes=graphs, max_batch_size=max_bs)
    keys = sorted(buckets)
    limit = max_bs if max_bs is not None else max(keys + graphs) + 5
    # Rows tile 1..limit without gaps, and each batch size routes where the row says.
    covered = []
    for r in cov.rows:
        hi = r.batch_max if r.batch_max is not None else limit
        for bs in range(r.batch_min, min(hi, limit) + 1):
            covered.append(bs)
            assert brute_route(keys, graphs, bs) == r.bucket
            assert cfg.route(bs, graphs).min_batch_size == r.bucket
            assert r.padded_size == min((g for g in graphs if g >= bs), default=None)
    assert covered == list(range(1, limit + 1))
    reached = {brute_route(keys, graphs, bs) for bs in range(1, limit + 1)}
    expected_states = {initial} | {s for k in reached for s in buckets[k]}
    assert set(cov.required_states) == expected_states
    assert set(cov.unreachable_buckets) == set(keys) - reached
    assert ("ADP101" in {f.code for f in findings}) == (initial not in cfg.union_steps)


json_values = st.recursive(
    st.none() | st.booleans() | st.integers(-5, 70) | st.floats() | st.text(max_size=6),
    lambda children: st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=8), children, max_size=4),
    max_leaves=20,
)
adaptive_like = st.dictionaries(
    st.sampled_from(["1", "8", "08", "0", "bs8", "-2", "ema_alpha", "ema_alfa", "strategy", "update_interval",
                     "ceiling_coeff", "window_size", "candidate_steps", "x"]),
    st.one_of(
        json_values, st.fixed_dictionaries({"candidate_steps": json_values}, optional={"ema_alpha": json_values})
    ),
    max_size=6,
)


@settings(max_examples=120, deadline=None)
@given(obj=st.one_of(json_values, adaptive_like), initial=st.integers(0, 9))
def test_parse_never_raises_and_findings_are_well_formed(obj: object, initial: int) -> None:
    rules = catalog.all_rules()
    for cfg, findings in (parse_sglang_config(obj), parse_deployment_adaptive({"buckets": obj})):
        if cfg is not None:
            cov, more = step_coverage(cfg, initial_steps=initial, graph_batch_sizes=[1, 2, 4], max_batch_size=16)
            findings = findings + more
            assert cov.rows and all(math.isfinite(b.knobs.ema_alpha) for b in cfg.buckets)
            assert all(0 < b.knobs.ema_alpha <= 1 and b.knobs.update_interval >= 1 for b in cfg.buckets)
        for f in findings:
            assert f.code in rules and f.severity == rules[f.code].severity
            assert f.path.startswith("$") and f.message and f.fix


def test_pad_batch_size() -> None:
    assert pad_batch_size(3, [4, 1, 2]) == 4
    assert pad_batch_size(4, [4]) == 4
    assert pad_batch_size(5, [4]) is None
    assert pad_batch_size(5, []) is None
