"""A compiled yes/no check for the deployment schema: the fast path for documents that are valid.

Contract: `compile_check(schema)` returns a function `doc -> bool` that answers True only when the
JSON Schema (draft 2020-12 subset used by `deployment.schema.json`) certainly accepts `doc`; any doubt
answers False, and the caller then runs `jsonschema` for the detailed errors. Keywords outside the
subset make `compile_check` raise `NotImplementedError`, so a schema edit can never make the fast
path wrong, only absent. Why: `jsonschema` spends ~10 ms per deployment resolving references, which
dominates validating many files; valid files are the common case and need no error messages.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

Check = Callable[[Any], bool]

_ANNOTATIONS = {"description", "default", "title", "$schema", "$id", "$comment", "examples", "$defs"}


def _is_int(v: Any) -> bool:
    # JSON Schema: 16.0 is an integer; booleans are not numbers.
    return (isinstance(v, int) and not isinstance(v, bool)) or (isinstance(v, float) and v.is_integer())


_TYPES: dict[str, Check] = {
    "object": lambda v: isinstance(v, dict),
    "array": lambda v: isinstance(v, list),
    "string": lambda v: isinstance(v, str),
    "integer": _is_int,
    "number": lambda v: isinstance(v, (int, float)) and not isinstance(v, bool),
    "boolean": lambda v: isinstance(v, bool),
    "null": lambda v: v is None,
}


def _plain(v: Any) -> bool:
    """Values whose Python equality is JSON equality (no bool/number mixing, no containers)."""
    return isinstance(v, str) or v is None


def compile_check(schema: dict[str, Any]) -> Check:
    root = schema
    cache: dict[str, Check] = {}

    def resolve(ref: str) -> Check:
        if not ref.startswith("#/"):
            raise NotImplementedError(ref)
        if ref not in cache:
            node: Any = root
            for part in ref[2:].split("/"):
                node = node[part]
            cache[ref] = lambda v: False  # placeholder breaks cycles; replaced below
            compiled = build(node)
            cache[ref] = compiled
        return lambda v: cache[ref](v)

    def build(s: dict[str, Any]) -> Check:
        checks: list[Check] = []
        for kw, val in s.items():
            if kw in _ANNOTATIONS:
                continue
            if kw == "$ref":
                checks.append(resolve(val))
            elif kw == "type":
                types = [_TYPES[t] for t in (val if isinstance(val, list) else [val])]
                checks.append(lambda v, ts=types: any(t(v) for t in ts))
            elif kw == "enum":
                if not all(_plain(x) for x in val):
                    raise NotImplementedError("enum of non-strings")
                checks.append(lambda v, allowed=tuple(val): _plain(v) and v in allowed)
            elif kw == "const":
                if not (_is_int(val) or _plain(val)):
                    raise NotImplementedError("const")
                checks.append(lambda v, c=val: type(v) is type(c) and v == c)
            elif kw in ("minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum"):
                op = {"minimum": lambda a, b: a >= b, "maximum": lambda a, b: a <= b,
                      "exclusiveMinimum": lambda a, b: a > b, "exclusiveMaximum": lambda a, b: a < b}[kw]
                checks.append(lambda v, op=op, b=val: not _TYPES["number"](v) or op(v, b))
            elif kw in ("minLength", "maxLength"):
                # len() counts code points, as JSON Schema does
                cmp = (lambda n, b: n >= b) if kw == "minLength" else (lambda n, b: n <= b)
                checks.append(lambda v, cmp=cmp, b=val: not isinstance(v, str) or cmp(len(v), b))
            elif kw == "pattern":
                rx = re.compile(val)
                checks.append(lambda v, rx=rx: not isinstance(v, str) or rx.search(v) is not None)
            elif kw in ("minItems", "maxItems"):
                cmp = (lambda n, b: n >= b) if kw == "minItems" else (lambda n, b: n <= b)
                checks.append(lambda v, cmp=cmp, b=val: not isinstance(v, list) or cmp(len(v), b))
            elif kw == "uniqueItems":
                if val:
                    checks.append(lambda v: not isinstance(v, list) or _unique(v))
            elif kw == "items":
                item = build(val)
                checks.append(lambda v, item=item: not isinstance(v, list) or all(item(x) for x in v))
            elif kw == "minProperties":
                checks.append(lambda v, b=val: not isinstance(v, dict) or len(v) >= b)
            elif kw == "required":
                checks.append(lambda v, req=tuple(val): not isinstance(v, dict) or all(k in v for k in req))
            elif kw in ("properties", "patternProperties", "additionalProperties"):
                continue  # compiled together below
            else:
                raise NotImplementedError(kw)
        if any(k in s for k in ("properties", "patternProperties", "additionalProperties")):
            checks.append(_object_check(s, build))
        return lambda v, cs=tuple(checks): all(c(v) for c in cs)

    return build(schema)


def _unique(items: list[Any]) -> bool:
    # Only decide for lists of plain ints/strings; anything else is "in doubt" (False).
    if not all(isinstance(x, str) or (isinstance(x, int) and not isinstance(x, bool)) for x in items):
        return False
    return len(set(items)) == len(items)


def _object_check(s: dict[str, Any], build: Callable[[dict[str, Any]], Check]) -> Check:
    props = {k: build(v) for k, v in s.get("properties", {}).items()}
    patterns = [(re.compile(p), build(v)) for p, v in s.get("patternProperties", {}).items()]
    extra = s.get("additionalProperties", True)
    if extra not in (True, False):
        raise NotImplementedError("additionalProperties schema")

    def check(v: Any) -> bool:
        if not isinstance(v, dict):
            return True
        for key, value in v.items():
            if not isinstance(key, str):
                return False  # in doubt: JSON keys are strings
            matched = False
            if key in props:
                matched = True
                if not props[key](value):
                    return False
            for rx, sub in patterns:
                if rx.search(key):
                    matched = True
                    if not sub(value):
                        return False
            if not matched and extra is False:
                return False
        return True

    return check
