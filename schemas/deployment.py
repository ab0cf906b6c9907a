"""The typed view of a validated deployment file: `Deployment` and the per-role merged config.

Contract: `load_deployment(source, overrides=...)` reads a file path, or a preset name
when no such file exists, applies `--set` overrides, validates it (schema + every semantic rule) and
returns a frozen `Deployment`; unreadable input raises `UsageError` (exit 2), error findings raise
`InvalidInput` (exit 1) with `.findings`. `Deployment.role(name)` is the fully merged config of one
role as a frozen `RoleConfig` (schemas/role_config.py), built once when the deployment is made: the
top-level `model`/`speculative`/`cache`/`serve`/`transfer` sections with that role's overrides
deep-merged on top (a role's `speculative.adaptive.buckets` replaces the whole table, so a role can drop a
bucket), defaults filled, plus `host`, `port`, `bootstrap_port`, `name` (and the router's `metrics_port`
and `kind`). `merge_role` gives the same merge as a dict, for the rules that read schema-invalid input.

A file without `roles` declares one `colocated` role on 127.0.0.1:30000.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from specctl.errors import InvalidInput, UsageError
from specctl.schemas.findings import Finding
from specctl.schemas.loader import child_path
from specctl.schemas.role_config import RoleConfig

ROLE_NAMES = ("prefill", "decode", "router", "colocated")
ENGINE_ROLES = ("prefill", "decode", "colocated")
SECTIONS = ("model", "speculative", "cache", "serve", "transfer")
DEFAULT_HOST = "127.0.0.1"
DEFAULT_COLOCATED_PORT = 30000
DEFAULT_NUM_STEPS = 3
ENGINES = ("builtin", "sglang")
DEFAULT_ENGINE = "builtin"

# Defaults of the schema (`default` keywords); tests assert the two agree.
DEFAULTS: dict[str, dict[str, Any]] = {
    "model": {"dtype": "float32", "device": "auto"},
    "speculative": {"algorithm": "none", "draft": None, "topk": 1, "adaptive": None,
                    "ngram": {"min_match": 1, "max_match": 4}},
    "cache": {"page_size": 16, "max_tokens": 32768},
    "serve": {"max_batch_size": 32, "graph_batch_sizes": []},
    "transfer": {"backend": "zmq", "protocol": "tcp", "timeout_s": 30},
}


def declared_roles(data: dict[str, Any]) -> tuple[str, ...]:
    """Roles a document declares, in canonical order; no `roles` section means colocated."""
    roles = data.get("roles")
    if not isinstance(roles, dict) or not roles:
        return ("colocated",)
    return tuple(r for r in ROLE_NAMES if isinstance(roles.get(r), dict)
                 or (isinstance(roles.get(r), list) and bool(roles[r]) and isinstance(roles[r][0], dict)))


def json_copy(value: Any) -> Any:
    """Deep copy of JSON data (dict/list/scalars); several times faster than copy.deepcopy."""
    # scalars are returned as they are without a call: validating many files copies many sections
    if isinstance(value, dict):
        return {k: json_copy(v) if isinstance(v, _CONTAINERS) else v for k, v in value.items()}
    if isinstance(value, list):
        return [json_copy(v) if isinstance(v, _CONTAINERS) else v for v in value]
    return value


_CONTAINERS = (dict, list)


def _deep_merge(base: Any, over: Any, *, key: str = "") -> Any:
    if key == "buckets" or not (isinstance(base, dict) and isinstance(over, dict)):
        return json_copy(over)
    out = dict(base)
    for k, v in over.items():
        if k in base:
            out[k] = _deep_merge(base[k], v, key=k)
        else:
            out[k] = json_copy(v) if isinstance(v, _CONTAINERS) else v
    return out


def union_candidates(adaptive: Any) -> list[int]:
    """Sorted union of candidate_steps over all buckets (tolerant of malformed input)."""
    steps: set[int] = set()
    buckets = adaptive.get("buckets") if isinstance(adaptive, dict) else None
    if isinstance(buckets, dict):
        for b in buckets.values():
            cands = b.get("candidate_steps") if isinstance(b, dict) else None
            if isinstance(cands, list):
                steps.update(c for c in cands if isinstance(c, int) and not isinstance(c, bool))
    return sorted(steps)


def merge_role(data: dict[str, Any], role: str, instance: int = 0) -> dict[str, Any]:
    """The merged config dict of one role (see module contract). Tolerates schema-invalid input.
    prefill and decode may list several instances; `instance` picks one (the rules check instance 0,
    the topology rules every instance)."""
    return _merge_role(data, role, None, instance)


def mapping_at(data: dict[str, Any], key: str) -> dict[str, Any]:
    """`data[key]` when it is a mapping, else an empty one (the document may be schema-invalid)."""
    node = data.get(key)
    return node if isinstance(node, dict) else {}


def role_instance_count(data: dict[str, Any], role: str) -> int:
    cfg = mapping_at(data, "roles").get(role)
    return len(cfg) if isinstance(cfg, list) and cfg else 1


def _role_cfg(roles: dict[str, Any], role: str, instance: int = 0) -> dict[str, Any]:
    cfg = roles.get(role)
    if isinstance(cfg, list):
        cfg = cfg[instance] if 0 <= instance < len(cfg) else None
    return cfg if isinstance(cfg, dict) else {}


def merge_roles(data: dict[str, Any], roles: Sequence[str]) -> dict[str, dict[str, Any]]:
    """`{role: merge_role(data, role)}` for validation, without copying: each role's section dicts are
    new, but the values in them are the document's own (and the defaults') objects, and a section no
    role overrides is merged once and shared by those roles. So the result is strictly read-only;
    `Deployment.role` gives callers their own deep copy."""
    shared: dict[str, dict[str, Any]] = {}
    return {role: _merge_role(data, role, shared) for role in roles}


def _merge_ro(base: Any, over: Any, *, key: str = "") -> Any:
    """`_deep_merge` without copies (see merge_roles): a new dict where both sides are dicts, else `over`."""
    if key == "buckets" or not (isinstance(base, dict) and isinstance(over, dict)):
        return over
    out = dict(base)
    for k, v in over.items():
        out[k] = _merge_ro(base[k], v, key=k) if k in base else v
    return out


def _merge_role(data: dict[str, Any], role: str, shared: dict[str, dict[str, Any]] | None,
                instance: int = 0) -> dict[str, Any]:
    role_cfg = _role_cfg(mapping_at(data, "roles"), role, instance)
    out: dict[str, Any] = {"name": role}
    for section in SECTIONS:
        over = role_cfg.get(section)
        top = data.get(section)
        if shared is None:
            merged = json_copy(DEFAULTS[section])
            if isinstance(top, dict):
                merged = _deep_merge(merged, top)
            if isinstance(over, dict):
                merged = _deep_merge(merged, over)
        elif isinstance(over, dict) or section not in shared:
            merged = _merge_ro(DEFAULTS[section], top) if isinstance(top, dict) else dict(DEFAULTS[section])
            if isinstance(over, dict):
                merged = _merge_ro(merged, over)
            else:
                shared[section] = merged
        else:
            merged = shared[section]
        out[section] = merged
    spec = out["speculative"]
    if spec.get("num_steps") is None:  # a shared section gets the same value from every role
        if spec.get("algorithm") == "none":
            spec["num_steps"] = 0
        else:
            union = union_candidates(spec.get("adaptive"))
            # SGLang's default initial step: the middle of the candidates' union.
            spec["num_steps"] = union[len(union) // 2] if union else DEFAULT_NUM_STEPS
    out["host"] = role_cfg.get("host", DEFAULT_HOST)
    out["port"] = role_cfg.get("port", DEFAULT_COLOCATED_PORT if role == "colocated" else None)
    out["bootstrap_port"] = role_cfg.get("bootstrap_port")
    if role == "router":
        out["metrics_port"] = role_cfg.get("metrics_port")  # the router's Prometheus port (None: a free one)
        out["kind"] = role_cfg.get("kind") or "smg"
    return out


def override_path(data: dict[str, Any], role: str, *keys: str) -> str:
    """JSON path of the value a role actually uses: the role override if written, else top level."""
    node: Any = mapping_at(data, "roles").get(role)
    for k in keys:
        if not isinstance(node, dict) or k not in node:
            node = None
            break
        node = node[k]
    base = child_path(child_path("$", "roles"), role) if node is not None else "$"
    for k in keys:
        base = child_path(base, k)
    return base


@dataclass(frozen=True)
class Deployment:
    """A validated deployment (after overrides). `raw` is the document; `role()` the merged view."""

    name: str
    path: str | None
    raw: dict[str, Any] = field(repr=False)
    roles: tuple[str, ...] = ()
    findings: tuple[Finding, ...] = field(default=(), repr=False)  # warnings/infos that did not fail
    # Every instance of every declared role, merged and typed once, here.
    configs: dict[str, tuple[RoleConfig, ...]] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        configs = {name: tuple(RoleConfig.from_json(merge_role(self.raw, name, i))
                               for i in range(role_instance_count(self.raw, name))) for name in self.roles}
        object.__setattr__(self, "configs", configs)

    def role(self, name: str) -> RoleConfig:
        """The merged config of a role (its first instance where several are listed)."""
        return self.instances(name)[0]

    def instances(self, name: str) -> list[RoleConfig]:
        """Every instance of a role, merged (one for a role written as an object)."""
        if name not in self.configs:
            raise UsageError(
                f"deployment {self.name!r} has no {name!r} role",
                hint=f"declared roles: {', '.join(self.roles)}",
            )
        return list(self.configs[name])

    @property
    def engine(self) -> str:
        """`builtin` (specctl's torch engine, the default) or `sglang` (SGLang servers)."""
        return str(self.raw.get("engine") or DEFAULT_ENGINE)

    @property
    def sglang_python(self) -> str | None:
        """`sglang.python`: the interpreter that has SGLang (None: the one running specctl)."""
        value = (self.raw.get("sglang") or {}).get("python")
        return str(value) if value else None

    @property
    def engine_roles(self) -> tuple[str, ...]:
        return tuple(r for r in self.roles if r in ENGINE_ROLES)


def resolve_source(source: str | Path) -> Path:
    """A file path, or the file of a preset name; UsageError listing presets when neither."""
    p = Path(source)
    if p.exists():
        return p
    from specctl import presets

    if str(source) in presets.names():
        return presets.path(str(source))
    raise UsageError(
        f"{source}: no such file or preset",
        hint=f"presets: {', '.join(presets.names())} (specctl presets list)",
    )


def load_deployment(source: str | Path, *, overrides: Sequence[str] = ()) -> Deployment:
    """Load, override and validate a deployment (see module contract)."""
    from specctl.schemas.validator import Validator

    path = resolve_source(source)
    validator = Validator(overrides=overrides, kind="deployment")
    result = validator.validate_file(path)
    if result.load_error is not None:
        raise result.load_error
    errors = [f for f in result.findings if f.severity == "error"]
    if errors:
        first = errors[0]
        where = f"{path}:{first.line}" if first.line else str(path)
        more = f" (and {len(errors) - 1} more)" if len(errors) > 1 else ""
        exc = InvalidInput(
            f"{where}: {first.code} {first.path}: {first.message}{more}",
            hint=f"{first.fix}  Run `specctl validate {path}` for every finding.".strip(),
        )
        exc.findings = errors  # type: ignore[attr-defined]
        raise exc
    data = result.data or {}
    return Deployment(
        name=str(data.get("name") or path.stem),
        path=str(path),
        raw=data,
        roles=declared_roles(data),
        findings=tuple(result.findings),
    )
