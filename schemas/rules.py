"""What semantic rules see: a `RuleContext` per document (merged roles, source paths, model facts).

Contract: each rule module (`rules_capacity`, `rules_fallback`, `rules_model`, `rules_topology`)
exposes `check(ctx: RuleContext) -> list[Finding]`; `rules_pd` also `check_pair(prefill, decode)`
over two `RoleRef`s (possibly from two files). Rules read only the sections of a role that passed
the schema (`ctx.engine_roles(*sections)`, `ctx.clean(role, ...)`), so a schema error is never
echoed (or tripped over) by a semantic rule. Model facts come from
`config.json` through `FactsCache` (shared across the files of one invocation); a model that is not
on this host yields `None` (the model rule reports it once, as info) and the rules that need it skip.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from specctl.errors import UsageError
from specctl.schemas.deployment import declared_roles, mapping_at, override_path
from specctl.schemas.findings import Finding, Severity
from specctl.schemas.model_facts import ModelFacts, load_model_facts, model_available, safe_exists

# Rule modules, in reporting order (also registered in catalog.RULE_MODULES).
RULE_MODULES = (
    "specctl.schemas.rules_capacity",
    "specctl.schemas.rules_fallback",
    "specctl.schemas.rules_model",
    "specctl.schemas.rules_pd",
    "specctl.schemas.rules_topology",
)

# The `dtype` widths, for state/KV item sizes in bytes.
DTYPE_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2}


@dataclass
class FactsCache:
    """ModelFacts per reference, read once per invocation. Values: facts, or the reason there are none."""

    _cache: dict[str, ModelFacts | str] = field(default_factory=dict)

    def get(self, ref: str) -> ModelFacts | str:
        """Facts, or "absent" (not on this host), or an error message (unusable config.json)."""
        if ref not in self._cache:
            if (not ref.startswith("builtin:") and not model_available(ref)
                    and not safe_exists(Path(ref).expanduser())):
                self._cache[ref] = "absent"  # a path on the serving host (a directory here without config.json
                # falls through to load_model_facts, which names what is missing)
            else:
                try:
                    # engine=False: every family SGLang serves, not only the builtin engine's
                    self._cache[ref] = load_model_facts(ref, engine=False)
                except UsageError as exc:
                    self._cache[ref] = f"{exc}" + (f" ({exc.hint})" if exc.hint else "")
        return self._cache[ref]

    def facts(self, ref: object) -> ModelFacts | None:
        if not isinstance(ref, str) or not ref:
            return None
        got = self.get(ref)
        return got if isinstance(got, ModelFacts) else None


@dataclass
class RuleContext:
    """One document under validation: its data, merged roles that passed the schema, and helpers."""

    name: str
    data: dict[str, Any]
    roles: dict[str, dict[str, Any]]  # every declared role, merged
    facts_cache: FactsCache
    topology_clean: bool = True  # no schema errors under roles/transfer
    all_roles: tuple[str, ...] = ()
    # role -> sections ("model", "speculative", ...) holding a schema error; rules skip what they read there
    bad_sections: dict[str, set[str]] = field(default_factory=dict)

    def path(self, role: str, *keys: str) -> str:
        """JSON path of the value `role` uses for `keys` (role override if written, else top level)."""
        return override_path(self.data, role, *keys)

    def section(self, key: str) -> dict[str, Any]:
        """The document's top-level `key` when it is a mapping, else an empty one."""
        return mapping_at(self.data, key)

    def facts(self, ref: object) -> ModelFacts | None:
        return self.facts_cache.facts(ref)

    def clean(self, role: str, *sections: str) -> bool:
        """True when none of `sections` of `role` (top level or override) has a schema error."""
        bad = self.bad_sections.get(role)
        if not bad:
            return True  # the common case: checked per rule and role, so no sets are built for it
        return not (bad & set(sections or ("model", "speculative", "cache", "serve", "transfer")))

    def engine_roles(self, *sections: str) -> list[tuple[str, dict[str, Any]]]:
        """Engine roles (not router) whose `sections` passed the schema (all sections when none given)."""
        return [(r, cfg) for r, cfg in self.roles.items() if r != "router" and self.clean(r, *sections)]


@dataclass(frozen=True)
class RoleRef:
    """One side of a PD pair: the context (file) and the role name inside it."""

    ctx: RuleContext
    role: str

    @property
    def cfg(self) -> dict[str, Any]:
        return self.ctx.roles[self.role]

    def path(self, *keys: str) -> str:
        return self.ctx.path(self.role, *keys)

    def where(self) -> str:
        return f"{self.ctx.name} ({self.role})"


def finding(code: str, severity: Severity, path: str, message: str, fix: str) -> Finding:
    return Finding(code=code, severity=severity, path=path, message=message, fix=fix)


def effective_state_types(cfg: dict[str, Any], facts: ModelFacts | None) -> tuple[tuple[str, ...] | None, bool]:
    """(state_types a role runs with, written?) — the written list, else the model-derived one."""
    written = cfg.get("cache", {}).get("state_types")
    if isinstance(written, list):
        return tuple(written), True
    return (facts.state_types if facts is not None else None), False


def rule_checks() -> list[Callable[[RuleContext], list[Finding]]]:
    import importlib

    return [importlib.import_module(m).check for m in RULE_MODULES]


__all__ = ["RuleContext", "RoleRef", "FactsCache", "declared_roles", "finding", "rule_checks"]
