"""A compiled yes/no check for the deployment schema: the fast path for documents that are valid.

Contract: `compile_check(schema)` returns a function `doc -> bool` that answers True only when the
JSON Schema (draft 2020-12 subset used by `deployment.schema.json`) certainly accepts `doc`; any doubt
answers False, and the caller then runs `jsonschema` for the detailed errors. Keywords outside the
subset make `compile_check` raise `NotImplementedError`, so a schema edit can never make the fast
path wrong, only absent. Why: `jsonschema` spends ~10 ms per deployment resolving references, which
dominates validating many files; valid files are the common case and need no error messages.
`generate_check(schema)` answers exactly the same, compiled to Python source (see there).
"""

from __future__ import annotations

import operator
import re
from collections.abc import Callable, Sized
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
                checks.append(types[0] if len(types) == 1 else _any_of(tuple(types)))
            elif kw == "enum":
                if not all(_plain(x) for x in val):
                    raise NotImplementedError("enum of non-strings")
                checks.append(_enum(tuple(val)))
            elif kw == "const":
                if not (_is_int(val) or _plain(val)):
                    raise NotImplementedError("const")
                checks.append(_const(val))
            elif kw in ("minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum"):
                checks.append(_bound(_OPS[kw], val))
            elif kw in ("minLength", "maxLength"):
                # len() counts code points, as JSON Schema does
                checks.append(_sized(str, operator.ge if kw == "minLength" else operator.le, val))
            elif kw == "pattern":
                checks.append(_pattern(re.compile(val)))
            elif kw in ("minItems", "maxItems"):
                checks.append(_sized(list, operator.ge if kw == "minItems" else operator.le, val))
            elif kw == "uniqueItems":
                if val:
                    checks.append(lambda v: not isinstance(v, list) or _unique(v))
            elif kw == "items":
                checks.append(_items(build(val)))
            elif kw == "minProperties":
                checks.append(_sized(dict, operator.ge, val))
            elif kw == "required":
                checks.append(_required(tuple(val)))
            elif kw in ("properties", "patternProperties", "additionalProperties"):
                continue  # compiled together below
            else:
                raise NotImplementedError(kw)
        if any(k in s for k in ("properties", "patternProperties", "additionalProperties")):
            checks.append(_object_check(s, build))
        return _all_of(tuple(checks))

    return build(schema)


# Combinators as plain loops: the fast path runs once per file over every node of the schema, and
# generator expressions inside all()/any() cost several times more per call than a loop.


def _true(v: Any) -> bool:
    return True


# One keyword's check each, bound to its schema value (the interpreter above; `generate_check` writes them
# out as source). A keyword about one JSON type passes every value of another type.
_OPS: dict[str, Callable[[Any, Any], bool]] = {
    "minimum": operator.ge, "maximum": operator.le, "exclusiveMinimum": operator.gt, "exclusiveMaximum": operator.lt}


def _enum(allowed: tuple[Any, ...]) -> Check:
    return lambda v: _plain(v) and v in allowed


def _const(c: Any) -> Check:
    return lambda v: type(v) is type(c) and v == c


def _bound(op: Callable[[Any, Any], bool], b: Any) -> Check:
    return lambda v: not _TYPES["number"](v) or op(v, b)


def _sized(kind: type[Sized], cmp: Callable[[int, Any], bool], b: Any) -> Check:
    return lambda v: not isinstance(v, kind) or cmp(len(v), b)


def _pattern(rx: re.Pattern[str]) -> Check:
    return lambda v: not isinstance(v, str) or rx.search(v) is not None


def _required(req: tuple[str, ...]) -> Check:
    return lambda v: not isinstance(v, dict) or all(k in v for k in req)


def _all_of(checks: tuple[Check, ...]) -> Check:
    if not checks:
        return _true
    if len(checks) == 1:
        return checks[0]

    def check(v: Any) -> bool:
        for c in checks:
            if not c(v):
                return False
        return True

    return check


def _any_of(checks: tuple[Check, ...]) -> Check:
    def check(v: Any) -> bool:
        for c in checks:
            if c(v):
                return True
        return False

    return check


def _items(item: Check) -> Check:
    def check(v: Any) -> bool:
        if isinstance(v, list):
            for x in v:
                if not item(x):
                    return False
        return True

    return check


def generate_check(schema: dict[str, Any]) -> Check:
    """The same check as `compile_check`, as generated Python source: one function per schema node with
    every keyword inlined, about twice as fast per document, but it costs milliseconds to compile, so
    the validator switches to it only once a run has checked enough files to win that back."""
    return _Generator(schema).compile()


_TYPE_EXPR = {
    "object": "isinstance(v, dict)",
    "array": "isinstance(v, list)",
    "string": "isinstance(v, str)",
    "integer": "((isinstance(v, int) and not isinstance(v, bool)) or (isinstance(v, float) and v.is_integer()))",
    "number": "(isinstance(v, (int, float)) and not isinstance(v, bool))",
    "boolean": "isinstance(v, bool)",
    "null": "v is None",
}
_BOUND_OPS = {"minimum": ">=", "maximum": "<=", "exclusiveMinimum": ">", "exclusiveMaximum": "<"}


class _Generator:
    """Emits `def _fN(v): ...; return True` per schema node; every failed keyword returns False."""

    def __init__(self, schema: dict[str, Any]) -> None:
        self.root = schema
        self.ns: dict[str, Any] = {"_unique": _unique}
        self.lines: list[str] = []
        self.tail: list[str] = []  # property tables, filled once every function is defined
        self.refs: dict[str, str] = {}
        self.count = 0

    def compile(self) -> Check:
        name = self.build(self.root)
        code = compile("\n".join(self.lines + self.tail) + "\n", "<specctl.schemas.fastschema>", "exec")
        exec(code, self.ns)  # noqa: S102 - our own source, generated from the packaged schema
        return self.ns[name]  # type: ignore[no-any-return]

    def const(self, value: Any) -> str:
        self.count += 1
        name = f"_c{self.count}"
        self.ns[name] = value
        return name

    def resolve(self, ref: str) -> str:
        if not ref.startswith("#/"):
            raise NotImplementedError(ref)
        if ref not in self.refs:
            node: Any = self.root
            for part in ref[2:].split("/"):
                node = node[part]
            self.count += 1
            self.refs[ref] = name = f"_r{self.count}"  # named before it is built: recursive refs call it
            self.build(node, name)
        return self.refs[ref]

    def build(self, s: dict[str, Any], name: str | None = None) -> str:
        """Emit the function for schema node `s`; returns its name."""
        keys = [k for k in s if k not in _ANNOTATIONS]
        if name is None and keys == ["$ref"]:
            return self.resolve(s["$ref"])  # a bare reference: call its target directly
        if name is None:
            self.count += 1
            name = f"_f{self.count}"
        body: list[str] = []
        for kw in keys:
            val = s[kw]
            if kw == "$ref":
                body.append(f"if not {self.resolve(val)}(v): return False")
            elif kw == "type":
                types = val if isinstance(val, list) else [val]
                body.append(f"if not ({' or '.join(_TYPE_EXPR[t] for t in types)}): return False")
            elif kw == "enum":
                if not all(_plain(x) for x in val):
                    raise NotImplementedError("enum of non-strings")
                allowed = self.const(tuple(val))
                body.append(f"if not ((isinstance(v, str) or v is None) and v in {allowed}): return False")
            elif kw == "const":
                if not (_is_int(val) or _plain(val)):
                    raise NotImplementedError("const")
                c = self.const(val)
                body.append(f"if not (type(v) is type({c}) and v == {c}): return False")
            elif kw in _BOUND_OPS:
                bound = self.const(val)
                body.append(f"if {_TYPE_EXPR['number']} and not (v {_BOUND_OPS[kw]} {bound}): return False")
            elif kw in ("minLength", "maxLength"):
                # len() counts code points, as JSON Schema does
                op = ">=" if kw == "minLength" else "<="
                body.append(f"if isinstance(v, str) and not (len(v) {op} {self.const(val)}): return False")
            elif kw == "pattern":
                rx = self.const(re.compile(val))
                body.append(f"if isinstance(v, str) and {rx}.search(v) is None: return False")
            elif kw in ("minItems", "maxItems"):
                op = ">=" if kw == "minItems" else "<="
                body.append(f"if isinstance(v, list) and not (len(v) {op} {self.const(val)}): return False")
            elif kw == "uniqueItems":
                if val:
                    body.append("if isinstance(v, list) and not _unique(v): return False")
            elif kw == "items":
                item = self.build(val)
                body += ["if isinstance(v, list):", "    for x in v:", f"        if not {item}(x): return False"]
            elif kw == "minProperties":
                body.append(f"if isinstance(v, dict) and len(v) < {self.const(val)}: return False")
            elif kw == "required":
                body += ["if isinstance(v, dict):", f"    for k in {self.const(tuple(val))}:",
                         "        if k not in v: return False"]
            elif kw in ("properties", "patternProperties", "additionalProperties"):
                continue  # compiled together below
            else:
                raise NotImplementedError(kw)
        if any(k in s for k in ("properties", "patternProperties", "additionalProperties")):
            body += self.object_check(s)
        self.lines.append(f"def {name}(v):")
        self.lines.extend("    " + line for line in body)
        self.lines.append("    return True")
        return name

    def object_check(self, s: dict[str, Any]) -> list[str]:
        extra = s.get("additionalProperties", True)
        if extra not in (True, False):
            raise NotImplementedError("additionalProperties schema")
        props = {k: self.build(v) for k, v in s.get("properties", {}).items()}
        patterns = [(self.const(re.compile(p)), self.build(v)) for p, v in s.get("patternProperties", {}).items()]
        table = self.const({})
        self.tail.append(f"{table}.update({{{', '.join(f'{k!r}: {fn}' for k, fn in props.items())}}})")
        out = [
            "if isinstance(v, dict):",
            "    for key, value in v.items():",
            "        if not isinstance(key, str): return False",  # in doubt: JSON keys are strings
            f"        sub = {table}.get(key)",
            "        if sub is not None:",
            "            if not sub(value): return False",
        ]
        if not patterns:
            if extra is False:
                out.append("        else: return False")
            return out
        out += ["            matched = True", "        else:", "            matched = False"]
        for rx, fn in patterns:
            out += [f"        if {rx}.search(key):", "            matched = True",
                    f"            if not {fn}(value): return False"]
        if extra is False:
            out.append("        if not matched: return False")
        return out


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

    get = props.get

    def check(v: Any) -> bool:
        if not isinstance(v, dict):
            return True
        for key, value in v.items():
            if not isinstance(key, str):
                return False  # in doubt: JSON keys are strings
            sub = get(key)
            if sub is not None:
                if not sub(value):
                    return False
                if not patterns:
                    continue
                matched = True
            else:
                matched = False
            for rx, sub in patterns:
                if rx.search(key):
                    matched = True
                    if not sub(value):
                        return False
            if not matched and extra is False:
                return False
        return True

    return check
