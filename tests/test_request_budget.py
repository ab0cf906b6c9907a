"""The end-to-end request budget (schemas/budget.py): finite and under its stated ceiling for every preset and any
context, the one figure that `up` and every export that runs a router write as its request timeout, and a
generation limit the disaggregated front enforces so that no admitted request outlives it.

The timeouts are read back the way each consumer reads them: `up`'s and `export sglang`'s argv through the
router's own argument parser, the rbg / lws / slurm exports from the text they print."""

from __future__ import annotations

import json
import math
import re
import sys

import pytest
from validate_helpers import run_cli

from specctl.engine.serve.openai_request import RequestError, parse_completion
from specctl.orchestrate.router import router_argv
from specctl.presets import names as preset_names
from specctl.schemas.budget import (
    GENERATION_CEILING_S,
    MAX_NEW_TOKENS,
    PD_STAGES,
    TOKEN_BOUND_S,
    budget_ceiling_s,
    budget_for,
    generation_limit,
    request_budget_s,
    transfer_timeout_s,
)
from specctl.schemas.deployment import load_deployment
from specctl.schemas.role_config import RoleConfig

from test_router_command import parsed  # isort: skip

PRESETS = sorted(preset_names())
PD_PRESETS = [p for p in PRESETS if "decode" in load_deployment(p).roles]
# The figure a request may never exceed with a transfer.timeout_s of at most a minute (every preset's).
STATED_CEILING_S = PD_STAGES * 60 + GENERATION_CEILING_S


def test_there_are_disaggregated_presets_to_check() -> None:
    assert {"tiny-pd", "llama-3.1-8b-pd"} <= set(PD_PRESETS)


@pytest.mark.parametrize("preset", PD_PRESETS)
def test_every_presets_budget_is_finite_and_under_the_stated_ceiling(preset: str) -> None:
    dep = load_deployment(preset)
    budget = request_budget_s(dep)
    timeout_s = transfer_timeout_s(dep.role("decode"))
    assert math.isfinite(budget) and budget > 0
    assert budget <= math.ceil(budget_ceiling_s(timeout_s)) <= STATED_CEILING_S
    # It still covers its PD stages and every generation the front admits.
    assert budget >= budget_for(timeout_s, generation_limit(dep.role("decode")))
    assert budget > PD_STAGES * timeout_s


def test_the_ceiling_holds_whatever_the_context() -> None:
    """A context of a million tokens (the old budget counted it whole: 13,288 s for llama-3.1-8b-pd) is capped at
    what the ceiling lets a request generate."""
    huge = RoleConfig.from_json({"cache": {"max_tokens": 1 << 20}, "transfer": {"timeout_s": 60}})
    assert generation_limit(huge) == MAX_NEW_TOKENS
    assert budget_for(60, generation_limit(huge)) == budget_ceiling_s(60) == PD_STAGES * 60 + GENERATION_CEILING_S
    assert MAX_NEW_TOKENS * TOKEN_BOUND_S <= GENERATION_CEILING_S
    assert request_budget_s(load_deployment("llama-3.1-8b-pd")) <= STATED_CEILING_S  # 262,144-token pool


def _k8s_timeouts(text: str) -> list[int]:
    return [int(v) for v in re.findall(r'- --request-timeout-secs\n\s*- "?(\d+)"?', text)]


@pytest.mark.parametrize("preset", PD_PRESETS)
def test_up_and_every_export_run_the_router_with_the_one_budget(preset: str) -> None:
    dep = load_deployment(preset)
    budget = request_budget_s(dep)
    assert parsed(router_argv(dep, python=sys.executable)).request_timeout_secs == budget
    result = run_cli("export", "sglang", "-c", preset, "--format", "json")
    assert result.exit_code == 0, result.output
    assert parsed(json.loads(result.stdout)["router"]).request_timeout_secs == budget
    for kind in ("rbg", "lws"):
        result = run_cli("export", kind, "-c", preset)
        assert result.exit_code == 0, result.output
        assert _k8s_timeouts(result.stdout) == [budget], kind
    result = run_cli("export", "slurm", "-c", preset)
    assert result.exit_code == 0, result.output
    assert [int(v) for v in re.findall(r"--request-timeout-secs (\d+)", result.stdout)] == [budget]


class _Front:
    """A disaggregated role's front as the parser sees it: a large context, the budget's generation limit."""

    model_name = "m"
    max_context = 1 << 20
    max_new_tokens = MAX_NEW_TOKENS

    def encode(self, text: str) -> list[int]:
        return list(text.encode())


def test_the_disaggregated_front_refuses_a_generation_longer_than_the_budget_allows() -> None:
    ok = parse_completion({"model": "m", "prompt": "hi", "max_tokens": MAX_NEW_TOKENS}, _Front(), vocab_size=None)
    assert ok.params.max_tokens == MAX_NEW_TOKENS
    with pytest.raises(RequestError) as err:
        parse_completion({"model": "m", "prompt": "hi", "max_tokens": MAX_NEW_TOKENS + 1}, _Front(), vocab_size=None)
    assert err.value.status == 400 and err.value.param == "max_tokens"
    assert str(MAX_NEW_TOKENS) in str(err.value) and "budget" in str(err.value)


def test_the_disaggregated_roles_carry_the_limit_and_a_colocated_one_does_not() -> None:
    from specctl.engine.serve.backend import RoleContext, TokenizingBackend

    dep = load_deployment("tiny-pd")
    limits = {name: TokenizingBackend(RoleContext(deployment=dep, role_name=name, role=dep.role(name)),
                                      dep.role(name)).max_new_tokens for name in ("prefill", "decode")}
    assert limits == {"prefill": MAX_NEW_TOKENS, "decode": MAX_NEW_TOKENS}
    colo = load_deployment("tiny-colocated")
    role = colo.role("colocated")
    assert TokenizingBackend(RoleContext(deployment=colo, role_name="colocated", role=role), role).max_new_tokens \
        is None
