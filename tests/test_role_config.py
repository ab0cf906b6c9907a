"""RoleConfig: the typed view of a role equals the merged dict it was read from, for every preset and role,
and a wrong type is refused naming the field."""

from __future__ import annotations

from typing import Any

import pytest

from specctl import presets
from specctl.errors import InvalidInput
from specctl.schemas.deployment import load_deployment, merge_role
from specctl.schemas.role_config import RoleConfig


@pytest.mark.parametrize("preset", presets.names())
def test_every_presets_roles_read_the_same_typed_as_merged(preset: str) -> None:
    dep = load_deployment(preset)
    for name in dep.roles:
        for i, cfg in enumerate(dep.instances(name)):
            merged = merge_role(dep.raw, name, i)
            assert cfg.to_json() == merged  # JSON outputs (resolved_role, the preflight's comparison) unchanged
            model, spec, cache, serve, transfer = (merged[k] for k in ("model", "speculative", "cache", "serve",
                                                                       "transfer"))
            assert (cfg.name, cfg.host, cfg.port, cfg.bootstrap_port) == (
                merged["name"], merged["host"], merged["port"], merged["bootstrap_port"])
            assert (cfg.model.target, cfg.model.dtype, cfg.model.device) == (
                model.get("target"), model["dtype"], model["device"])
            assert (cfg.speculative.algorithm, cfg.speculative.draft, cfg.speculative.num_steps,
                    cfg.speculative.topk, cfg.speculative.adaptive) == (
                spec["algorithm"], spec["draft"], spec["num_steps"], spec["topk"], spec["adaptive"])
            assert (cfg.cache.page_size, cfg.cache.max_tokens) == (cache["page_size"], cache["max_tokens"])
            assert cfg.cache.state_types == (tuple(cache["state_types"]) if "state_types" in cache else None)
            assert (cfg.serve.max_batch_size, list(cfg.serve.graph_batch_sizes)) == (
                serve["max_batch_size"], serve["graph_batch_sizes"])
            assert (cfg.transfer.backend, cfg.transfer.protocol, cfg.transfer.timeout_s) == (
                transfer["backend"], transfer["protocol"], transfer["timeout_s"])
            if name == "router":
                assert (cfg.metrics_port, cfg.kind) == (merged["metrics_port"], merged["kind"])


@pytest.mark.parametrize(("doc", "field"), [
    ({"model": {"target": 5}}, "model.target"),
    ({"cache": {"page_size": True}}, "cache.page_size"),
    ({"serve": {"graph_batch_sizes": [1, "2"]}}, "serve.graph_batch_sizes"),
    ({"transfer": {"timeout_s": "30"}}, "transfer.timeout_s"),
    ({"speculative": {"adaptive": [1]}}, "speculative.adaptive"),
    ({"port": "30000"}, "port"),
])
def test_a_wrong_type_is_refused_naming_the_field(doc: dict[str, Any], field: str) -> None:
    with pytest.raises(InvalidInput, match=field.replace(".", r"\.")):
        RoleConfig.from_json(doc)
