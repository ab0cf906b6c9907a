"""Property-based fuzzing of validate: random documents, random text and random mutations of the
presets never produce a traceback; the exit code is 0, 1 or 2; every finding has a code and a path."""

from __future__ import annotations

import copy
import re
import tempfile
from pathlib import Path
from typing import Any

import yaml
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st
from validate_helpers import run_cli

from specctl.errors import UsageError
from specctl.schemas.findings import SEVERITIES
from specctl.schemas.loader import parse_document
from specctl.schemas.validator import Validator

KEYS = ["version", "name", "model", "target", "dtype", "device", "speculative", "algorithm", "draft", "num_steps",
        "topk", "adaptive", "buckets", "candidate_steps", "ema_alpha", "update_interval", "warmup_batches",
        "down_hysteresis", "cache", "page_size", "max_tokens", "state_types", "serve", "max_batch_size",
        "graph_batch_sizes", "roles", "prefill", "decode", "router", "colocated", "host", "port", "bootstrap_port",
        "transfer", "backend", "1", "8", "32", "bs8", "0"]
SCALARS = st.one_of(
    st.none(), st.booleans(), st.integers(-(2**70), 2**70), st.floats(allow_nan=True, allow_infinity=True),
    st.sampled_from(["builtin:tiny-hybrid", "builtin:tiny-draft", "builtin:nope", "draft", "ngram", "none",
                     "mamba", "swa", "zmq", "shm", "127.0.0.1", "localhost", "0.0.0.0", "host-x", "/nonexistent",
                     "float32", "bfloat16", "cuda:1", "", "."]),
    st.text(max_size=8),
)
VALUES = st.recursive(
    SCALARS,
    lambda inner: st.one_of(
        st.lists(inner, max_size=5),
        st.dictionaries(st.one_of(st.sampled_from(KEYS), st.text(max_size=6)), inner, max_size=6),
    ),
    max_leaves=30,
)
PRESETS = ["tiny-pd", "tiny-colocated", "sglang-default-adaptive", "llama-3.1-8b-pd"]
VALIDATOR = Validator()  # one per process, as in one CLI invocation


def _check(result: Any) -> None:
    for f in result.findings:
        assert re.fullmatch(r"[A-Z]{2,3}[0-9]{3}", f.code), f
        assert f.path.startswith("$"), f
        assert f.severity in SEVERITIES
        assert f.message


def _validate_text(text: str) -> None:
    try:
        doc = parse_document(text, name="fuzz.yaml")
    except UsageError as exc:
        assert str(exc)
        return
    _check(VALIDATOR.validate_document(doc))


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.dictionaries(st.sampled_from(KEYS), VALUES, max_size=8))
@example(data={"roles": {"version": {"host": []}}})  # found by this test: an unhashable host crashed TOP602
def test_random_documents(data: dict) -> None:
    _validate_text(yaml.safe_dump(data, allow_unicode=True) if _dumpable(data) else "{}")


@settings(max_examples=150, deadline=None)
@given(st.text(alphabet=st.sampled_from(list("{}[]:,-&*!|>'\"#%@ \n\t01258abx.~") + ["\u00e9"]), max_size=60))
def test_random_text(text: str) -> None:
    _validate_text(text)


def _paths(node: Any, prefix: tuple = ()) -> list[tuple]:
    out = [prefix]
    if isinstance(node, dict):
        for k, v in node.items():
            out += _paths(v, (*prefix, k))
    elif isinstance(node, list):
        for i, v in enumerate(node):
            out += _paths(v, (*prefix, i))
    return out


@st.composite
def mutated_presets(draw: st.DrawFn) -> dict:
    from specctl import presets

    data = yaml.safe_load(presets.read_text(draw(st.sampled_from(PRESETS))))
    for _ in range(draw(st.integers(1, 4))):
        paths = [p for p in _paths(data) if p]
        path = draw(st.sampled_from(paths))
        parent = data
        for k in path[:-1]:
            parent = parent[k]
        op = draw(st.sampled_from(["replace", "delete", "add", "copy"]))
        if op == "replace":
            parent[path[-1]] = draw(VALUES)
        elif op == "delete":
            del parent[path[-1]]
        elif op == "add" and isinstance(parent, dict):
            parent[draw(st.sampled_from(KEYS))] = draw(VALUES)
        elif op == "copy":
            parent[path[-1]] = copy.deepcopy(draw(st.sampled_from([data, parent])))
    return data


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(mutated_presets())
def test_mutated_presets(data: dict) -> None:
    _validate_text(yaml.safe_dump(data) if _dumpable(data) else "{}")


@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.one_of(mutated_presets(), st.dictionaries(st.sampled_from(KEYS), VALUES, max_size=6)))
def test_cli_exit_codes(data: dict) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "d.yaml"
        path.write_text(yaml.safe_dump(data) if _dumpable(data) else "{}")
        result = run_cli("validate", str(path), "--format", "json")  # raises on an unexpected exception
        assert result.exit_code in (0, 1, 2)
        assert "Traceback" not in result.stdout + result.stderr


def _dumpable(data: Any) -> bool:
    try:
        yaml.safe_dump(data)
    except (yaml.YAMLError, RecursionError):
        return False
    return True


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.one_of(mutated_presets(), st.dictionaries(st.sampled_from(KEYS), VALUES, max_size=6)))
def test_fast_schema_check_agrees_with_jsonschema(data: dict) -> None:
    """The compiled fast path may only say "valid" when jsonschema finds no error."""
    from specctl.schemas.validator import _compiled, _fast

    fast = _fast()
    assert fast is not None
    if fast(data):
        assert list(_compiled().iter_errors(data)) == []


def test_valid_presets_take_the_fast_path() -> None:
    from specctl import presets
    from specctl.schemas.validator import _fast

    for preset in PRESETS:
        assert _fast()(parse_document(presets.read_text(preset)).data)
