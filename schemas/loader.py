"""Read one YAML or JSON file into plain data plus the line/column of every JSON path.

Contract: `load_document(path)` returns a `Document` whose `data` is a dict of str keys holding only
JSON values (dict, list, str, int, float, bool, None) and whose `positions` map every JSON path
(`$.speculative.adaptive.buckets.8.candidate_steps`, list items as `.0`) to its 1-based line and
column. Anything that cannot be read this way raises `UsageError` (exit 2) with a message naming the
file and, where known, the line: a missing/unreadable file, a directory, non-UTF-8 bytes, a YAML
syntax error, an empty file, more than one document, a file over `MAX_BYTES`, nesting deeper than
`MAX_DEPTH`, alias expansion beyond `MAX_NODES` (alias bombs), integers beyond 64 bits, NaN or
infinite floats, a top-level value that is not a mapping, and keys that are not strings.

YAML integer keys (a bucket written `8:`) become the string "8"; any other non-string key is an
error. Duplicate keys are not fatal: they are returned as `duplicates` (path, line, column) so the
validator reports them as findings; the later value wins, as in JSON.

Why compose and construct ourselves: PyYAML's composer keeps aliases as shared nodes, so building
the data ourselves lets us bound expansion and record a position for every path; libyaml (when
present) caps flow nesting at 1000, and our walk caps depth well below Python's recursion limit.
"""

from __future__ import annotations

import functools
import math
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from specctl.errors import UsageError

MAX_BYTES = 1024 * 1024  # deployment files are a few KB; anything this large is not one.
MAX_DEPTH = 64
MAX_NODES = 100_000  # counts every node built, so an alias bomb fails fast and small.
MAX_INT = 2**63 - 1

_SIMPLE_KEY = re.compile(r"^[A-Za-z0-9_-]+$")
# JSON parsers commonly accept these non-standard literals; YAML reads them as strings. Reject them
# explicitly so `"ema_alpha": NaN` gets the NaN/inf message rather than a confusing type error.
_NONFINITE_WORDS = {"nan", "infinity", "+infinity", "-infinity", "inf", "+inf", "-inf"}

Position = tuple[int, int]


def child_path(base: str, key: str | int) -> str:
    """Append a key or index to a JSON path; odd keys are quoted: `$.roles["a b"]`."""
    if isinstance(key, int) or _SIMPLE_KEY.match(key):
        return f"{base}.{key}"
    escaped = key.replace("\\", "\\\\").replace('"', '\\"')
    return f'{base}["{escaped}"]'


@dataclass(frozen=True)
class Document:
    """A parsed file: JSON-shaped `data`, `positions` per JSON path, duplicate keys seen."""

    name: str
    data: dict[str, Any]
    positions: dict[str, Position | None] = field(default_factory=dict)
    duplicates: tuple[tuple[str, int, int], ...] = ()

    def position(self, path: str) -> Position | None:
        """Line/column of `path` or of its nearest ancestor that has one (None: not from the file)."""
        p = path
        while True:
            if p in self.positions:
                return self.positions[p]
            parent = _parent(p)
            if parent is None:
                return None
            p = parent


def _parent(path: str) -> str | None:
    if path in ("$", ""):
        return None
    if path.endswith('"]'):
        i = path.rfind('["')
        return path[:i] if i > 0 else "$"
    i = path.rfind(".")
    return path[:i] if i > 0 else "$"


def read_text(path: str | Path) -> str:
    """The file's text; UsageError for anything that is not a readable, UTF-8, reasonably small file."""
    p = Path(path)
    try:
        if p.is_dir():
            raise UsageError(f"{p}: is a directory, not a deployment file", hint="pass the YAML/JSON file(s) inside it")
        with p.open("rb") as fh:
            raw = fh.read(MAX_BYTES + 1)
    except FileNotFoundError:
        hint = "check the path; `specctl presets list` shows the presets"
        raise UsageError(f"{p}: no such file", hint=hint) from None
    except IsADirectoryError:
        raise UsageError(f"{p}: is a directory, not a deployment file") from None
    except PermissionError:
        raise UsageError(f"{p}: permission denied", hint="make the file readable (chmod +r)") from None
    except OSError as exc:
        raise UsageError(f"{p}: cannot read: {exc.strerror or exc}") from None
    if len(raw) > MAX_BYTES:
        raise UsageError(
            f"{p}: file is larger than {MAX_BYTES // 1024} KiB; not a deployment file",
            hint="deployment and adaptive-config files are a few KB",
        )
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = raw[: exc.start].count(b"\n") + 1
        raise UsageError(f"{p}:{line}: not UTF-8 text (byte 0x{raw[exc.start]:02x} at offset {exc.start})") from None
    if "\x00" in text:
        raise UsageError(f"{p}: contains NUL bytes; not a text file")
    return text.removeprefix("\ufeff")


def load_document(path: str | Path) -> Document:
    """Read and parse a YAML/JSON file (see the module contract)."""
    return parse_document(read_text(path), name=str(path))


_RESOLVED: dict[tuple[Any, Any, Any], str] = {}


@functools.lru_cache(maxsize=1)
def _loader_class() -> Any:
    """libyaml's safe loader (when built) with memoized implicit tag resolution.

    PyYAML resolves every scalar's tag in Python by trying regexes; files validated together repeat
    the same scalars ("16", "127.0.0.1", "float32"), so the resolution is cached (bounded).
    """
    import yaml

    base = getattr(yaml, "CSafeLoader", yaml.SafeLoader)

    class _Loader(base):  # type: ignore[misc, valid-type]
        def resolve(self, kind: Any, value: Any, implicit: Any) -> str:
            key = (kind, value, implicit)
            tag = _RESOLVED.get(key)
            if tag is None:
                tag = super().resolve(kind, value, implicit)
                if len(_RESOLVED) > 50_000:
                    _RESOLVED.clear()
                _RESOLVED[key] = tag
            return tag

    return _Loader


def parse_document(text: str, *, name: str = "<string>") -> Document:
    """Parse YAML/JSON text into a `Document`; UsageError on anything unreadable."""
    import yaml

    loader_cls = _loader_class()
    try:
        node = yaml.compose(text, Loader=loader_cls)
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        where = f":{mark.line + 1}:{mark.column + 1}" if mark is not None else ""
        problem = exc.problem or exc.context or "syntax error"
        if "another document" in problem:
            problem = "more than one YAML document (`---`); a deployment is one document"
        raise UsageError(f"{name}{where}: YAML syntax error: {problem}", hint=_syntax_hint(problem)) from None
    except yaml.YAMLError as exc:
        raise UsageError(f"{name}: YAML syntax error: {exc}") from None
    except RecursionError:
        raise UsageError(f"{name}: nesting deeper than {MAX_DEPTH} levels") from None
    if node is None:
        raise UsageError(f"{name}: file is empty", hint="start from `specctl presets show tiny-colocated`")
    builder = _Builder(name)
    data = builder.build(node, "$", 0)
    if not isinstance(data, dict):
        kind = "a list" if isinstance(data, list) else f"the scalar {data!r}"
        raise UsageError(
            f"{name}:{node.start_mark.line + 1}: the top level is {kind}; expected a mapping (object)",
            hint="a deployment file starts with `version: 1`; an SGLang adaptive config is a JSON object",
        )
    return Document(name=name, data=data, positions=builder.positions, duplicates=tuple(builder.duplicates))


def parse_scalar(text: str, *, name: str = "--set") -> Any:
    """Parse one `--set` value as YAML (a scalar, or a flow list/map such as `[1, 2, 4]`)."""
    import yaml

    try:
        node = yaml.compose(text, Loader=_loader_class())
    except yaml.YAMLError as exc:
        problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
        raise UsageError(f"{name}: cannot parse value {text!r}: {problem}") from None
    if node is None:
        return None
    return _Builder(name).build(node, "$", 0)


def _syntax_hint(problem: str) -> str:
    if "tab" in problem:
        return "YAML indentation uses spaces, not tabs"
    if "mapping values are not allowed" in problem:
        return "a value containing ': ' must be quoted, or a key is mis-indented"
    return "check indentation and quoting near the reported line"


class _Builder:
    """Builds JSON data from a composed YAML node graph, with positions and hard resource bounds."""

    def __init__(self, name: str) -> None:
        import yaml

        self.name = name
        self.positions: dict[str, Position | None] = {}
        self.duplicates: list[tuple[str, int, int]] = []
        self.nodes = 0
        self._yaml = yaml
        self._constructor = yaml.SafeLoader("")  # only for its scalar constructors (ints, floats, bools)

    def _fail(self, node: Any, message: str, hint: str = "") -> UsageError:
        return UsageError(f"{self.name}:{node.start_mark.line + 1}:{node.start_mark.column + 1}: {message}", hint=hint)

    def build(self, node: Any, path: str, depth: int) -> Any:
        yaml = self._yaml
        self.nodes += 1
        if self.nodes > MAX_NODES:
            raise self._fail(
                node,
                f"more than {MAX_NODES} values after expanding YAML aliases (an alias bomb?)",
                hint="deployment files need no deep alias chains; write the values out",
            )
        if depth > MAX_DEPTH:
            raise self._fail(node, f"nesting deeper than {MAX_DEPTH} levels")
        self.positions.setdefault(path, (node.start_mark.line + 1, node.start_mark.column + 1))
        if isinstance(node, yaml.ScalarNode):
            return self._scalar(node)
        if node.tag not in ("tag:yaml.org,2002:seq", "tag:yaml.org,2002:map"):
            hint = "plain YAML scalars, lists and mappings only"
            raise self._fail(node, f"unsupported YAML tag {node.tag}", hint=hint)
        if isinstance(node, yaml.SequenceNode):
            return [self.build(item, child_path(path, i), depth + 1) for i, item in enumerate(node.value)]
        if isinstance(node, yaml.MappingNode):
            return self._mapping(node, path, depth)
        raise self._fail(node, f"unsupported YAML node {type(node).__name__}")  # pragma: no cover

    def _mapping(self, node: Any, path: str, depth: int) -> dict[str, Any]:
        yaml = self._yaml
        out: dict[str, Any] = {}
        merged: dict[str, Any] = {}
        for key_node, value_node in node.value:
            if key_node.tag == "tag:yaml.org,2002:merge":
                # `<<: *base` — merge keys; explicit keys of this mapping win.
                sources = value_node.value if isinstance(value_node, yaml.SequenceNode) else [value_node]
                for src in sources:
                    value = self.build(src, path, depth + 1)
                    if not isinstance(value, dict):
                        raise self._fail(src, "a `<<` merge key needs a mapping")
                    for k, v in value.items():
                        merged.setdefault(k, v)
                continue
            key = self._key(key_node)
            kpath = child_path(path, key)
            line, col = key_node.start_mark.line + 1, key_node.start_mark.column + 1
            if key in out:
                self.duplicates.append((kpath, line, col))
            self.positions[kpath] = (line, col)  # findings point at the key, where the user looks
            out[key] = self.build(value_node, kpath, depth + 1)
            # the value's own position (for values on their own line) is not needed; keep the key's
            self.positions[kpath] = (line, col)
        for k, v in merged.items():
            out.setdefault(k, v)
        return out

    def _key(self, node: Any) -> str:
        yaml = self._yaml
        if not isinstance(node, yaml.ScalarNode):
            raise self._fail(node, "a mapping key must be a string, not a list or mapping")
        if node.tag == "tag:yaml.org,2002:str":
            return node.value
        if node.tag == "tag:yaml.org,2002:int":
            # Buckets are written `8:`; SGLang's JSON spells them "8". Both become "8".
            return str(self._int(node))
        kind = {"tag:yaml.org,2002:bool": "a boolean", "tag:yaml.org,2002:null": "null",
                "tag:yaml.org,2002:float": "a float"}.get(node.tag, f"a {node.tag.rsplit(':', 1)[-1]}")
        raise self._fail(
            node,
            f"key {node.value!r} is read as {kind}, not a string",
            hint=f'quote it: "{node.value}":',
        )

    def _int(self, node: Any) -> int:
        if node.value.isdigit() and len(node.value) < 19:  # fast path: plain decimal, < 2**63
            return int(node.value)
        text = node.value.replace("_", "")
        digits = len(text.lstrip("+-0xob"))
        if digits > 40:  # also keeps int() away from CPython's 4300-digit conversion limit
            raise self._fail(node, "integer is too large (more than 64 bits)")
        try:
            value = int(self._constructor.construct_yaml_int(node))
        except (ValueError, TypeError):
            raise self._fail(node, f"cannot read integer {node.value!r}") from None
        if abs(value) > MAX_INT:
            raise self._fail(node, f"integer {value} is too large (more than 64 bits)")
        return value

    def _scalar(self, node: Any) -> Any:
        tag = node.tag
        if tag == "tag:yaml.org,2002:str":
            # plain (unquoted) style is None in PyYAML and "" in libyaml
            if not node.style and node.value.lower() in _NONFINITE_WORDS:
                raise self._fail(node, f"{node.value} is not a finite number", hint="use a finite number")
            return node.value
        if tag == "tag:yaml.org,2002:int":
            return self._int(node)
        if tag == "tag:yaml.org,2002:float":
            try:
                value = float(self._constructor.construct_yaml_float(node))
            except (ValueError, TypeError, OverflowError):
                raise self._fail(node, f"cannot read number {node.value!r}") from None
            if not math.isfinite(value):
                raise self._fail(node, f"{node.value} is not a finite number", hint="use a finite number")
            return value
        if tag == "tag:yaml.org,2002:bool":
            return bool(self._constructor.construct_yaml_bool(node))
        if tag == "tag:yaml.org,2002:null":
            return None
        if tag == "tag:yaml.org,2002:timestamp":
            return node.value  # a date is just text to us; the schema decides whether text is allowed
        raise self._fail(
            node, f"unsupported YAML tag {tag}", hint="plain YAML scalars, lists and mappings only"
        )
