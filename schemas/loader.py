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

`load_document(path, lazy_positions=True)` (what `validate` uses) first tries `fast_data`, a reader
for the plain subset most deployment files are written in, which returns the same data or declines;
then `positions` are computed on first use by the full parser, so only files with findings pay for
them. Everything else (and every error) goes through the full parser below.

Why compose and construct ourselves: PyYAML's composer keeps aliases as shared nodes, so building
the data ourselves lets us bound expansion and record a position for every path; libyaml (when
present) caps flow nesting at 1000, and our walk caps depth well below Python's recursion limit.
"""

from __future__ import annotations

import errno
import functools
import math
import os
import re
import stat
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from specctl.errors import UsageError

MAX_BYTES = 1024 * 1024  # deployment files are a few KB; anything this large is not one.
MAX_DEPTH = 64
MAX_NODES = 100_000  # counts every node built, so an alias bomb fails fast and small.
MAX_INT = 2**63 - 1
_O_NONBLOCK = getattr(os, "O_NONBLOCK", 0)
_O_NOCTTY = getattr(os, "O_NOCTTY", 0)

_SIMPLE_KEY = re.compile(r"^[A-Za-z0-9_-]+$")
# JSON parsers commonly accept these non-standard literals; YAML reads them as strings. Reject them
# explicitly so `"ema_alpha": NaN` gets the NaN/inf message rather than a confusing type error.
_NONFINITE_WORDS = {"nan", "infinity", "+infinity", "-infinity", "inf", "+inf", "-inf"}

Position = tuple[int, int]


_CHILD_SUFFIX: dict[str, str] = {}  # key -> ".key" or '["odd key"]' (rules build many paths per file)


def child_path(base: str, key: str | int) -> str:
    """Append a key or index to a JSON path; odd keys are quoted: `$.roles["a b"]`."""
    if isinstance(key, int):
        return f"{base}.{key}"
    suffix = _CHILD_SUFFIX.get(key)
    if suffix is None:
        if _SIMPLE_KEY.match(key):
            suffix = f".{key}"
        else:
            escaped = key.replace("\\", "\\\\").replace('"', '\\"')
            suffix = f'["{escaped}"]'
        if len(_CHILD_SUFFIX) < 10_000:
            _CHILD_SUFFIX[key] = suffix
    return base + suffix


class Document:
    """A parsed file: JSON-shaped `data`, `positions` per JSON path, duplicate keys seen.

    Read-only by convention. `positions` may be lazy (`load_document(..., lazy_positions=True)`): the
    file's text is kept and re-parsed by the positional builder the first time a position is asked
    for, so a clean file in a many-file run never pays for them.
    """

    __slots__ = ("name", "data", "_positions", "duplicates", "_source", "_unset")

    def __init__(
        self,
        name: str,
        data: dict[str, Any],
        positions: dict[str, Position | None] | None = None,
        duplicates: tuple[tuple[str, int, int], ...] = (),
        *,
        source: str | None = None,
        unset: tuple[str, ...] = (),
    ) -> None:
        self.name = name
        self.data = data
        self._positions = positions if positions is not None or source is not None else {}
        self.duplicates = duplicates
        self._source = source  # text to re-parse for positions (lazy); None when positions are given
        self._unset = unset  # paths set by --set: their subtrees have no position in the file

    def __repr__(self) -> str:
        return f"Document(name={self.name!r}, data={self.data!r})"

    @property
    def positions(self) -> dict[str, Position | None]:
        if self._positions is None:
            positions = dict(parse_document(self._source or "", name=self.name).positions)
            for p in self._unset:
                for k in [k for k in positions if _under(k, p)]:
                    del positions[k]
                positions[p] = None
            self._positions = positions
        return self._positions

    def with_data(self, data: dict[str, Any], unset: Sequence[str]) -> Document:
        """This document with `data` replaced (after `--set`): positions under `unset` paths are None."""
        if self._positions is None:
            return Document(self.name, data, None, self.duplicates, source=self._source,
                            unset=self._unset + tuple(unset))
        positions = dict(self._positions)
        for p in unset:
            for k in [k for k in positions if _under(k, p)]:
                del positions[k]
            positions[p] = None  # came from --set: no line in the file
        return Document(self.name, data, positions, self.duplicates)

    def position(self, path: str) -> Position | None:
        """Line/column of `path` or of its nearest ancestor that has one (None: not from the file)."""
        positions = self.positions
        p = path
        while True:
            if p in positions:
                return positions[p]
            parent = _parent(p)
            if parent is None:
                return None
            p = parent


def _under(path: str, prefix: str) -> bool:
    return path == prefix or path.startswith(prefix + ".") or path.startswith(prefix + "[")


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
    try:  # open first, stat only on failure: one system call less per file when validating many
        # O_NONBLOCK: opening a FIFO with no writer must not hang (it is refused below, by fstat)
        fd = os.open(p, os.O_RDONLY | _O_NONBLOCK | _O_NOCTTY)
        with open(fd, "rb", buffering=0) as fh:  # unbuffered: small files need no buffer object
            mode = os.fstat(fd).st_mode
            if not stat.S_ISREG(mode):
                if stat.S_ISDIR(mode):
                    raise IsADirectoryError
                kind = "a FIFO (named pipe)" if stat.S_ISFIFO(mode) else "a socket" if stat.S_ISSOCK(mode) \
                    else "a device"
                raise UsageError(f"{p}: is {kind}, not a regular file; not read",
                                 hint="pass the file itself (process substitution <(...) is a pipe: save it first)")
            raw = fh.read(MAX_BYTES + 1) or b""
            while raw and len(raw) <= MAX_BYTES:  # pipes (<(cat f)) may return less per read
                more = fh.read(MAX_BYTES + 1 - len(raw))
                if not more:
                    break
                raw += more
    except FileNotFoundError:
        hint = "check the path; `specctl presets list` shows the presets"
        raise UsageError(f"{p}: no such file", hint=hint) from None
    except IsADirectoryError:
        raise _dir_error(p) from None
    except PermissionError:
        if _is_dir(p):
            raise _dir_error(p) from None
        raise UsageError(f"{p}: permission denied", hint="make the file readable (chmod +r)") from None
    except OSError as exc:
        if _is_dir(p):
            raise _dir_error(p) from None
        if exc.errno == errno.ENAMETOOLONG:
            raise UsageError(f"{str(p)[:80]}...: the path is too long ({len(str(p))} characters)") from None
        if exc.errno == errno.ELOOP:
            raise UsageError(f"{p}: too many levels of symbolic links (a link loop?)") from None
        if exc.errno == errno.ENXIO:  # opening a UNIX socket (or a device without a driver)
            raise UsageError(f"{p}: is a socket or a special file, not a regular file; not read") from None
        raise UsageError(f"{p}: cannot read: {exc.strerror or exc}") from None
    except ValueError as exc:  # a NUL byte in the path
        raise UsageError(f"{p!r}: not a usable path: {exc}") from None
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


def _dir_error(p: Path) -> UsageError:
    return UsageError(f"{p}: is a directory, not a deployment file", hint="pass the YAML/JSON file(s) inside it")


def _is_dir(p: Path) -> bool:
    try:
        return p.is_dir()
    except OSError:
        return False


def load_document(path: str | Path, *, lazy_positions: bool = False) -> Document:
    """Read and parse a YAML/JSON file (see the module contract).

    `lazy_positions`: try the fast parser first (`fast_data`); when it reads the file, positions are
    computed only on first use (by the full parser, so they are identical). Same data, same errors.
    """
    text = read_text(path)
    if lazy_positions:
        data = fast_data(text)
        if data is not None:
            return Document(str(path), data, None, source=text)
    return parse_document(text, name=str(path))


_RESOLVED: dict[tuple[Any, Any, Any], str] = {}


@functools.lru_cache(maxsize=1)
def _loader_class() -> Any:
    """libyaml's safe loader (when built) with memoized implicit tag resolution.

    PyYAML resolves every scalar's tag in Python by trying regexes; files validated together repeat
    the same scalars ("16", "127.0.0.1", "float32"), so the resolution is cached (bounded).
    """
    import yaml  # type: ignore[import-untyped, unused-ignore]  # noqa: PLC0415 - PyYAML: only for documents the fast loader does not read (`specctl validate` start-up)

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
    import yaml  # noqa: PLC0415 - PyYAML: only for documents the fast loader does not read (`specctl validate` start-up)

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
    import yaml  # noqa: PLC0415 - PyYAML: only for documents the fast loader does not read (`specctl validate` start-up)

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
        import yaml  # noqa: PLC0415 - PyYAML: only for documents the fast loader does not read (`specctl validate` start-up)

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
            return str(node.value)
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


# -- fast path -----------------------------------------------------------------------------------------
#
# Validating many files is dominated by YAML parsing, and most deployment files are plain block
# mappings of simple scalars and one-line flow lists/maps. `fast_data` reads exactly that subset in
# one pass over the lines and answers None for anything else (anchors, tags, block sequences, multi-line
# scalars, escapes, non-ASCII, duplicate keys, syntax errors...), so the caller falls back to the full
# parser, which alone produces every error message and position. Scalars are resolved and built by the
# full parser's own code (`_Builder._scalar` / `_key` on a node with the tag PyYAML's resolver gives),
# memoized by text, so values are identical by construction.

_FAST_UNSAFE = re.compile(r"[^\x20-\x7e\n]")  # tabs, CR, control and non-ASCII characters: full parser
_FAST_KEY = r"[A-Za-z0-9_][A-Za-z0-9_.\-]*"
_FAST_LINE = re.compile(rf"( *)({_FAST_KEY}|\"[A-Za-z0-9_.\- ]*\"|'[A-Za-z0-9_.\- ]*'):(?: +(.*?))? *")
_FAST_PLAIN = re.compile(r"(?:[A-Za-z0-9_./~+]|-(?=[A-Za-z0-9_./~+]))[A-Za-z0-9_./~+\-:@=]*")
_FAST_QUOTED = re.compile(r"(\"[^\"\\\\]*\"|'[^']*')(?: +#.*)?")
# flow tokens: an indicator, a `: ` separator, a plain scalar without ':' (its flow meaning varies), or a
# quoted scalar without escapes
_FAST_FLOW_TOKEN = re.compile(r" *(?:([\[\]{},])|(:)(?= )|((?:[A-Za-z0-9_./~+]|-(?=[A-Za-z0-9_./~+]))"
                              r"[A-Za-z0-9_./~+\-]*)|(\"[^\"\\\\]*\"|'[^']*')|(.))")
# parser states of `_fast_flow`: what the next token must be
_VALUE, _VALUE_OR_CLOSE, _KEY, _KEY_OR_CLOSE, _SEP, _COMMA_OR_CLOSE, _END = (object() for _ in range(7))
_FAST_MAX_CHARS = 64 * 1024  # < MAX_NODES values by far; bigger files take the full parser
_FAST_MAX_DEPTH = 16  # block + flow nesting stays far below MAX_DEPTH
_FAIL = object()
_MISSING = object()
_SCALARS: dict[tuple[str, str], Any] = {}  # (style, text) -> value, or _FAIL
_KEYS: dict[tuple[str, str], Any] = {}


class _Fallback(Exception):
    """The fast parser meets something outside its subset: use the full parser."""


@functools.lru_cache(maxsize=1)
def _fast_tools() -> tuple[Any, Any, Any, Any]:
    import yaml  # noqa: PLC0415 - PyYAML: only for documents the fast loader does not read (`specctl validate` start-up)

    resolver = _loader_class()("")
    mark = yaml.Mark("<fast>", 0, 0, 0, None, None)
    return yaml.ScalarNode, resolver, _Builder("<fast>"), mark


def _fast_node(text: str, style: str) -> Any:
    node_cls, resolver, _, mark = _fast_tools()
    tag = resolver.resolve(node_cls, text, (True, False)) if not style else "tag:yaml.org,2002:str"
    return node_cls(tag, text, mark, mark, style)


# PyYAML's implicit resolvers are chosen by a plain scalar's first character; none is registered for
# these, so such a scalar is always a string (tests/test_validate_perf_equivalence.py checks the table).
_STR_FIRST = frozenset("abcdeghijklmpqrsuvwxzABCDEGHIJKLMPQRSUVWXZ_/")
_WORD_FIRST = frozenset("yYnNtTfFoO")  # only the bool and null resolvers: exactly these words
_SIMPLE_NUMBER = re.compile(r"-?(?:(0|[1-9][0-9]{0,17})|[0-9]{1,18}\.[0-9]{1,18})")
_DOTTED = re.compile(r"[0-9]+(?:\.[0-9]+){2,}")  # 127.0.0.1: no float (one dot), int or date matches
_WORDS: dict[str, Any] = {
    **dict.fromkeys(("yes", "Yes", "YES", "true", "True", "TRUE", "on", "On", "ON"), True),
    **dict.fromkeys(("no", "No", "NO", "false", "False", "FALSE", "off", "Off", "OFF"), False),
    **dict.fromkeys(("null", "Null", "NULL"), None),
}


def _plain_shortcut(text: str) -> Any:
    """The value of a plain scalar without PyYAML for the common cases (same answer), else _MISSING.
    A typical file then needs no `import yaml` at all, which keeps one-file start-up fast."""
    first = text[0]
    if first in _STR_FIRST or first in _WORD_FIRST:
        if text in _WORDS:
            return _WORDS[text]
        if text.lower() in _NONFINITE_WORDS:
            return _MISSING  # a string by YAML, an error to us: the full path words it
        return text
    if first != "0" and text.isdigit() and len(text) < 19:
        return int(text)  # what the resolver and `_Builder._int` make of it (YAML 1.1 `[1-9][0-9_]*`)
    m = _SIMPLE_NUMBER.fullmatch(text)
    if m is not None:  # YAML 1.1: `-?(0|[1-9][0-9_]*)` is an int, `-?[0-9][0-9_]*\.[0-9_]*` a float
        return int(text) if m.group(1) is not None else float(text)
    if _DOTTED.fullmatch(text):
        return text
    return _MISSING


def _fast_scalar(text: str, style: str = "") -> Any:
    if not style:
        value = _plain_shortcut(text)
        if value is not _MISSING:
            return value
    key = (style, text)
    value = _SCALARS.get(key, _MISSING)
    if value is _MISSING:
        try:
            value = _fast_tools()[2]._scalar(_fast_node(text, style))
        except UsageError:
            value = _FAIL  # NaN, a huge integer, ...: the full parser words the error
        if len(_SCALARS) > 50_000:
            _SCALARS.clear()
        _SCALARS[key] = value
    if value is _FAIL:
        raise _Fallback
    return value


def _fast_key(text: str, style: str = "") -> str:
    if not style:
        value = _plain_shortcut(text)
        if isinstance(value, str):
            return value
        if type(value) is int:
            return text  # `8:` is the key "8" (str of the int; no sign, no leading zeros here)
    k = (style, text)
    value = _KEYS.get(k)
    if value is None:
        try:
            value = _fast_tools()[2]._key(_fast_node(text, style))
        except UsageError:
            value = _FAIL
        if len(_KEYS) > 50_000:
            _KEYS.clear()
        _KEYS[k] = value
    if value is _FAIL:
        raise _Fallback
    return value  # type: ignore[no-any-return]


def _fast_flow(text: str) -> Any:
    """A one-line flow collection of scalars (`[1, 2]`, `{a: 1, b: [x, y]}`), then only a comment."""
    if "#" in text:
        cut = text.find(" #")
        if cut < 0 or "'" in text or '"' in text:
            raise _Fallback  # `a#b`, or a `#` that may sit inside quotes
        text = text[:cut]
    stack: list[Any] = []  # open collections, innermost last
    keys: list[str] = []  # per open mapping: the key whose value comes next
    root: Any = None
    state = _VALUE
    for ind, sep, plain, quoted, bad in _FAST_FLOW_TOKEN.findall(text.rstrip(" ")):
        if bad:
            raise _Fallback
        if state is _VALUE or state is _VALUE_OR_CLOSE:
            if ind == "[" or ind == "{":
                value: Any = [] if ind == "[" else {}
            elif state is _VALUE_OR_CLOSE and ind == "]":
                stack.pop()
                state = _COMMA_OR_CLOSE if stack else _END
                continue
            elif plain:
                value = _fast_scalar(plain)
            elif quoted:
                value = _fast_scalar(quoted[1:-1], quoted[0])
            else:
                raise _Fallback  # `[1,]`, `{a: }`, a stray `:`...
            if not stack:
                root = value
            elif type(stack[-1]) is list:
                stack[-1].append(value)
            else:
                stack[-1][keys.pop()] = value
            if ind:
                if len(stack) >= _FAST_MAX_DEPTH:
                    raise _Fallback
                stack.append(value)
                state = _VALUE_OR_CLOSE if ind == "[" else _KEY_OR_CLOSE
            else:
                state = _COMMA_OR_CLOSE if stack else _END
        elif state is _KEY or state is _KEY_OR_CLOSE:
            if state is _KEY_OR_CLOSE and ind == "}":
                stack.pop()
                state = _COMMA_OR_CLOSE if stack else _END
                continue
            if plain:
                key = _fast_key(plain)
            elif quoted:
                key = _fast_key(quoted[1:-1], quoted[0])
            else:
                raise _Fallback  # a collection as key, `{a: 1,}`...
            if key in stack[-1]:
                raise _Fallback  # duplicate: the full parser reports it with its position
            keys.append(key)
            state = _SEP
        elif state is _SEP:
            if not sep:
                raise _Fallback  # `{a}`, `{a b: 1}`...
            state = _VALUE
        elif state is _COMMA_OR_CLOSE:
            top_is_list = type(stack[-1]) is list
            if ind == ",":
                state = _VALUE if top_is_list else _KEY
            elif ind == ("]" if top_is_list else "}"):
                stack.pop()
                state = _COMMA_OR_CLOSE if stack else _END
            else:
                raise _Fallback
        else:
            raise _Fallback  # text after the closing bracket
    if state is not _END:
        raise _Fallback
    return root


_LINES: dict[str, tuple[int, int, str, Any]] = {}  # line -> (kind, indent, key, value); see _fast_line
_SKIP, _EMPTY, _SCALAR, _FLOW = range(4)


def _fast_line(line: str) -> tuple[int, int, str, Any]:
    """One line of the block subset: (kind, indent, key, value); raises _Fallback outside the subset.

    Lines repeat across the files of one run ("  dtype: float32"), so `fast_data` memoizes this by the
    line's text; a flow value is then copied per use, since the data of each file must be its own.
    """
    stripped = line.lstrip(" ")
    if not stripped or stripped[0] == "#":
        return (_SKIP, 0, "", None)
    m = _FAST_LINE.fullmatch(line)
    if m is None:
        raise _Fallback
    indent_text, raw_key, rest = m.groups()
    key = _fast_key(raw_key[1:-1], raw_key[0]) if raw_key[0] in "\"'" else _fast_key(raw_key)
    if not rest or rest[0] == "#":
        return (_EMPTY, len(indent_text), key, None)  # null, unless a deeper block follows
    first = rest[0]
    if first in "[{":
        return (_FLOW, len(indent_text), key, _fast_flow(rest))
    if first in "\"'":
        q = _FAST_QUOTED.fullmatch(rest)
        if q is None:
            raise _Fallback
        return (_SCALAR, len(indent_text), key, _fast_scalar(q.group(1)[1:-1], first))
    cut = rest.find(" #")
    if cut >= 0:
        rest = rest[:cut].rstrip(" ")
    if not _FAST_PLAIN.fullmatch(rest) or rest.endswith(":"):
        raise _Fallback
    return (_SCALAR, len(indent_text), key, _fast_scalar(rest))


def fast_data(text: str) -> dict[str, Any] | None:
    """The data of `text` when it is in the fast parser's subset (see above), else None.

    Whenever it answers, the answer equals `parse_document(text).data` (same keys, order, types) and
    that document has no duplicate keys; None never means the text is invalid, only "ask the full parser".
    """
    if len(text) > _FAST_MAX_CHARS or _FAST_UNSAFE.search(text):
        return None
    root: dict[str, Any] = {}
    stack: list[tuple[int, dict[str, Any]]] = []
    pending: tuple[dict[str, Any], str, int] | None = None  # `key:` with its value on the next lines
    lines = _LINES
    try:
        for line in text.split("\n"):
            entry = lines.get(line)
            if entry is None:
                entry = _fast_line(line)
                if len(lines) > 50_000:
                    lines.clear()
                lines[line] = entry
            kind, indent, key, value = entry
            if kind == _SKIP:
                continue
            if pending is not None:
                parent, pkey, pindent = pending
                pending = None
                if indent > pindent:
                    if len(stack) >= _FAST_MAX_DEPTH:
                        return None
                    child: dict[str, Any] = {}
                    parent[pkey] = child
                    stack.append((indent, child))
            if not stack:
                stack.append((indent, root))
            while indent < stack[-1][0]:
                stack.pop()
                if not stack:
                    return None
            if indent != stack[-1][0]:
                return None  # a continuation line or a mis-indented key
            cur = stack[-1][1]
            if key in cur:
                return None  # duplicate key: the full parser reports it
            if kind == _FLOW:
                value = json_copy(value)
            elif kind == _EMPTY:
                pending = (cur, key, indent)
            cur[key] = value
    except _Fallback:
        return None
    return root if stack else None


def json_copy(value: Any) -> Any:
    """Deep copy of JSON data (dict/list/scalars)."""
    if isinstance(value, dict):
        return {k: json_copy(v) if isinstance(v, (dict, list)) else v for k, v in value.items()}
    if isinstance(value, list):
        return [json_copy(v) if isinstance(v, (dict, list)) else v for v in value]
    return value
