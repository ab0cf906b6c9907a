"""The catalog of validation rules: one `RuleDoc` per stable finding code, for `specctl explain`.

Rule modules declare their docs with `register(RuleDoc(...))` at import time; `all_rules()` imports
the known rule modules so the catalog is complete whoever asks first.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass

from specctl.schemas.findings import Severity

# Modules that register rules; each must be torch-free.
RULE_MODULES: tuple[str, ...] = (
    "specctl.schemas.adaptive",
    "specctl.schemas.validator",  # SCH0xx
    "specctl.schemas.rules_capacity",
    "specctl.schemas.rules_fallback",
    "specctl.schemas.rules_model",
    "specctl.schemas.rules_pd",
    "specctl.schemas.rules_topology",
    "specctl.schemas.sglang.command",  # SGL0xx: reading SGLang launch commands
    "specctl.schemas.sglang.rules",  # SGL1xx/2xx: SGLang-only traps and prefill/decode disagreements
    "specctl.schemas.sglang.verdicts",  # SGL9xx: SGLang's own start-up verdicts (validate --resolve)
)

_RULES: dict[str, RuleDoc] = {}


@dataclass(frozen=True)
class RuleDoc:
    """The long form of one rule: what it means, the runtime error it prevents, how to fix it."""

    code: str
    title: str
    severity: Severity
    summary: str
    runtime_error: str
    fix: str
    before: str = ""
    after: str = ""


def register(doc: RuleDoc) -> RuleDoc:
    existing = _RULES.get(doc.code)
    if existing is not None and existing != doc:
        raise ValueError(f"rule code {doc.code} registered twice with different docs")
    _RULES[doc.code] = doc
    return doc


def all_rules() -> dict[str, RuleDoc]:
    for mod in RULE_MODULES:
        importlib.import_module(mod)
    return dict(sorted(_RULES.items()))
