"""EngineConfig from a role config, and the role config from a merged role dict (the parse edge)."""

from __future__ import annotations

import pytest

from specctl.engine.config import EngineConfig
from specctl.errors import InvalidInput
from specctl.schemas.role_config import RoleConfig


def test_from_role_reads_every_section() -> None:
    role = {
        "name": "decode",
        "model": {"target": "builtin:tiny-hybrid", "dtype": "bfloat16", "device": "cpu"},
        "cache": {"page_size": 8, "max_tokens": 1024},
        "serve": {"max_batch_size": 4, "graph_batch_sizes": [1, 2, 4]},
        "speculative": {
            "algorithm": "draft",
            "draft": "builtin:tiny-draft",
            "num_steps": 3,
            "adaptive": {"buckets": {"1": {"candidate_steps": [1, 3, 5, 7]}, "8": {"candidate_steps": [0, 1]}}},
        },
    }
    cfg = EngineConfig.from_role(RoleConfig.from_json(role))
    assert cfg.model_ref == "builtin:tiny-hybrid" and cfg.dtype == "bfloat16" and cfg.device == "cpu"
    assert (cfg.page_size, cfg.max_tokens, cfg.max_batch_size) == (8, 1024, 4)
    assert cfg.graph_batch_sizes == (1, 2, 4)
    assert cfg.algorithm == "draft" and cfg.max_draft_tokens == 8
    assert cfg.name == "decode"


def test_defaults_when_sections_absent() -> None:
    cfg = EngineConfig.from_role(RoleConfig.from_json({"model": {"target": "builtin:tiny-draft"}}))
    assert cfg.device == "auto" and cfg.page_size == 16 and cfg.algorithm == "none" and cfg.max_draft_tokens == 1


@pytest.mark.parametrize(
    "role",
    [
        {},
        {"model": {"target": ""}},
        {"model": {"target": "x"}, "cache": {"page_size": 0}},
        {"model": {"target": "x"}, "serve": {"max_batch_size": "8"}},
        {"model": "x"},
    ],
)
def test_bad_roles_name_the_field(role: dict) -> None:
    with pytest.raises(InvalidInput):
        EngineConfig.from_role(RoleConfig.from_json(role))
