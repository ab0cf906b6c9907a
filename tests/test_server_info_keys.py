"""One `/server_info` key list: what specctl's servers write (`schemas.server_info.sglang_server_args`) is named
in `Key`, and what preflight reads back from it (`schemas.server_facts.normalise`) is what the deployment
asked for -- the writer and the reader agree through the one list."""

from __future__ import annotations

import json

import pytest

from specctl.preflight.diff import compare_with_deployment
from specctl.schemas.deployment import load_deployment
from specctl.schemas.server_facts import expected_facts, normalise, shape_of
from specctl.schemas.server_info import SERVER_ARGS, Key, sglang_server_args

KEYS = {v for k, v in vars(Key).items() if k.isupper()}


def test_the_key_list_has_no_two_names_for_one_key() -> None:
    names = [k for k in vars(Key) if k.isupper()]
    assert len(names) == len(KEYS)
    assert set(SERVER_ARGS) <= KEYS and len(SERVER_ARGS) == len(set(SERVER_ARGS))


@pytest.mark.parametrize("role_name", ["prefill", "decode"])
def test_every_written_key_is_named_and_reads_back_as_the_deployment_asked(role_name: str) -> None:
    role = load_deployment("tiny-pd").role(role_name).to_json()
    written = sglang_server_args(role, role_name, accept_length=2.5)
    assert set(written) <= KEYS, set(written) - KEYS
    doc = json.loads(json.dumps(written))  # what crosses HTTP
    assert shape_of(doc) == "sglang"
    running = normalise(f"http://{role_name}", doc)
    asked = expected_facts(role)
    assert compare_with_deployment(role_name, running, asked) == []
    assert running.role == role_name and running.accept_length == 2.5
    assert running.speculative_algorithm == "draft" and running.adaptive is True
    assert running.page_size == role["cache"]["page_size"] and running.dtype == role["model"]["dtype"]
    assert running.state_types == tuple(role["cache"]["state_types"])


def test_a_colocated_server_says_so() -> None:
    role = load_deployment("tiny-colocated").role("colocated").to_json()
    running = normalise("http://c", sglang_server_args(role, "colocated", accept_length=None))
    assert running.role == "colocated" and running.accept_length is None
