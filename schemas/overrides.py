"""Helm-style `--set a.b.c=value` overrides applied to a loaded document.

Contract: `parse_override("speculative.adaptive.buckets.8.candidate_steps=[1, 3]")` returns the key
path `("speculative", "adaptive", "buckets", "8", "candidate_steps")` and the value parsed as YAML
(`[1, 3]`); a scalar stays a scalar (`3` -> 3, `true` -> True, `bf16` -> "bf16", `null` -> None).
Keys are split on `.`; `\\.` is a literal dot; `name[2]` indexes an existing list. `apply_overrides`
returns a new dict (the input is never mutated) and creates missing intermediate mappings. Bad
syntax, or a path that runs through a scalar, raises `UsageError` naming the `--set` argument.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from specctl.errors import UsageError
from specctl.schemas.deployment import json_copy
from specctl.schemas.loader import child_path, parse_scalar

_INDEX = re.compile(r"^(?P<key>[^\[\]]*)(?P<idx>(\[\d+\])+)$")
_SYNTAX_HINT = "syntax: --set a.b.c=value (e.g. --set speculative.num_steps=5 --set model.dtype=bfloat16)"


@dataclass(frozen=True)
class Override:
    """One parsed `--set`: the key path (str keys, int list indices) and the value."""

    text: str
    keys: tuple[str | int, ...]
    value: Any

    @property
    def path(self) -> str:
        p = "$"
        for k in self.keys:
            p = child_path(p, k)
        return p


def _split_keys(spec: str, text: str) -> list[str]:
    parts: list[str] = []
    cur = []
    i = 0
    while i < len(spec):
        ch = spec[i]
        if ch == "\\" and i + 1 < len(spec) and spec[i + 1] == ".":
            cur.append(".")
            i += 2
            continue
        if ch == ".":
            parts.append("".join(cur))
            cur = []
        else:
            cur.append(ch)
        i += 1
    parts.append("".join(cur))
    if any(not p.strip() for p in parts):
        raise UsageError(f"--set {text!r}: empty key in {spec!r}", hint=_SYNTAX_HINT)
    return parts


def parse_override(text: str) -> Override:
    """Parse one `key.path=value` argument; UsageError on bad syntax."""

    if "=" not in text:
        raise UsageError(f"--set {text!r}: expected KEY=VALUE", hint=_SYNTAX_HINT)
    spec, value_text = text.split("=", 1)
    spec = spec.strip()
    if not spec:
        raise UsageError(f"--set {text!r}: missing key before '='", hint=_SYNTAX_HINT)
    keys: list[str | int] = []
    for part in _split_keys(spec, text):
        m = _INDEX.match(part)
        if m:
            if m.group("key"):
                keys.append(m.group("key"))
            keys.extend(int(i) for i in re.findall(r"\[(\d+)\]", m.group("idx")))
        elif "[" in part or "]" in part:
            raise UsageError(f"--set {text!r}: bad list index in {part!r}", hint="index lists as name[0]")
        else:
            keys.append(part)
    if not keys or not isinstance(keys[0], str):
        raise UsageError(f"--set {text!r}: the path must start with a key", hint=_SYNTAX_HINT)
    value = parse_scalar(value_text, name=f"--set {spec}")
    return Override(text=text, keys=tuple(keys), value=value)


def parse_overrides(texts: Sequence[str]) -> tuple[Override, ...]:
    return tuple(parse_override(t) for t in texts)


def apply_overrides(data: dict[str, Any], overrides: Sequence[str | Override]) -> dict[str, Any]:
    """A copy of `data` with every override applied in order (later ones win)."""

    out: dict[str, Any] = json_copy(data)
    for ov in overrides:
        o = ov if isinstance(ov, Override) else parse_override(ov)
        node: Any = out
        for depth, key in enumerate(o.keys[:-1]):
            nxt_key = o.keys[depth + 1]
            node = _descend(node, key, create=dict if isinstance(nxt_key, str) else None, text=o.text)
        last = o.keys[-1]
        if isinstance(last, int):
            if not isinstance(node, list) or last >= len(node):
                raise UsageError(f"--set {o.text!r}: no list item [{last}] to set")
            node[last] = o.value
        elif isinstance(node, dict):
            node[last] = o.value
        else:
            raise UsageError(f"--set {o.text!r}: {last!r} is inside a {type(node).__name__}, not a mapping")
    return out


def _descend(node: Any, key: str | int, *, create: type | None, text: str) -> Any:
    if isinstance(key, int):
        if not isinstance(node, list) or key >= len(node):
            raise UsageError(f"--set {text!r}: no list item [{key}]")
        return node[key]
    if not isinstance(node, dict):
        raise UsageError(f"--set {text!r}: cannot set {key!r} inside a {type(node).__name__} value")
    if key not in node or node[key] is None:
        if create is None:
            raise UsageError(f"--set {text!r}: {key!r} is not a list to index")
        node[key] = create()
    return node[key]
