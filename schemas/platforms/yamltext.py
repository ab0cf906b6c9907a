"""YAML text with comments: the writer behind every exported manifest.

Contract: `dump(obj)` writes dicts, lists and scalars as block-style YAML that `yaml.safe_load` reads back to
the same value. A `Note(value, comment)` anywhere in the tree keeps `value` and writes `comment` beside it
(after a scalar, on the line above a mapping or list), which is how exports mark the fields a user must fill
in. Strings with a newline are written as literal blocks (`|`); other strings stay plain when YAML would read
them back as the same string, else double-quoted (JSON's quoting, which YAML reads).
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any

_PLAIN = re.compile(r"^(?:--?[A-Za-z]|[A-Za-z0-9_/$(])[A-Za-z0-9_./:=$()@+-]*$")
_SPECIAL = re.compile(r"^(?:true|false|yes|no|on|off|null|~|y|n)$", re.IGNORECASE)


@dataclass(frozen=True)
class Note:
    """A value with a comment written beside it."""

    value: Any
    comment: str


def scalar(value: Any) -> str:
    """One scalar as YAML text."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        return json.dumps(value)
    text = str(value)
    if _PLAIN.match(text) and not _SPECIAL.match(text) and not _number_like(text) and _reads_back(text):
        return text
    return json.dumps(text)


def _reads_back(text: str) -> bool:
    import yaml  # type: ignore[import-untyped, unused-ignore]  # noqa: PLC0415 - PyYAML: only for manifests and exports (`specctl validate` start-up)

    try:
        return bool(yaml.safe_load(text) == text)
    except yaml.YAMLError:
        return False


def _number_like(text: str) -> bool:
    try:
        float(text)
    except ValueError:
        return text.startswith("0x") or text.startswith("0o") or ":" in text and text.replace(":", "").isdigit()
    return True


def _unwrap(value: Any) -> tuple[Any, str]:
    if isinstance(value, Note):
        return value.value, value.comment
    return value, ""


def _comment_lines(pad: str, comment: str) -> list[str]:
    return [f"{pad}# {line}".rstrip() for line in comment.splitlines()]


def _is_leaf(value: Any) -> bool:
    return not isinstance(value, (dict, list)) or not value


def _leaf(value: Any) -> str:
    if isinstance(value, dict):
        return "{}"
    if isinstance(value, list):
        return "[]"
    return scalar(value)


def _emit(obj: Any, indent: int, out: list[str]) -> None:
    pad = " " * indent
    if isinstance(obj, dict):
        for key, raw in obj.items():
            value, comment = _unwrap(raw)
            k = scalar(key)
            if isinstance(value, str) and "\n" in value:
                out.extend(_comment_lines(pad, comment))
                out.append(f"{pad}{k}: |" + ("-" if not value.endswith("\n") else ""))
                out.extend(f"{pad}  {line}".rstrip() for line in value.rstrip("\n").split("\n"))
            elif _is_leaf(value):
                out.append(f"{pad}{k}: {_leaf(value)}" + (f"  # {comment}" if comment else ""))
            else:
                out.extend(_comment_lines(pad, comment))
                out.append(f"{pad}{k}:")
                _emit(value, indent + 2, out)
    elif isinstance(obj, list):
        for raw in obj:
            value, comment = _unwrap(raw)
            if isinstance(value, str) and "\n" in value:
                out.extend(_comment_lines(pad, comment))
                out.append(f"{pad}- |" + ("-" if not value.endswith("\n") else ""))
                out.extend(f"{pad}  {line}".rstrip() for line in value.rstrip("\n").split("\n"))
            elif _is_leaf(value):
                out.append(f"{pad}- {_leaf(value)}" + (f"  # {comment}" if comment else ""))
            else:
                out.extend(_comment_lines(pad, comment))
                inner: list[str] = []
                _emit(value, indent + 2, inner)
                out.append(f"{pad}- {inner[0][indent + 2:]}")
                out.extend(inner[1:])
    else:
        out.append(pad + scalar(obj))


def dump(obj: Any, *, header: str = "") -> str:
    """One YAML document (see the module contract); `header` becomes leading comment lines."""
    out = _comment_lines("", header) if header else []
    _emit(obj, 0, out)
    return "\n".join(out) + "\n"


def dump_all(docs: list[Any], *, header: str = "") -> str:
    """Several documents separated by `---`, the header before the first."""
    return (f"{chr(10).join(_comment_lines('', header))}\n" if header else "") + "---\n".join(
        dump(d) for d in docs)


def plain(obj: Any) -> Any:
    """The tree without its notes (what a YAML reader sees)."""
    if isinstance(obj, Note):
        return plain(obj.value)
    if isinstance(obj, dict):
        return {k: plain(v) for k, v in obj.items()}
    if isinstance(obj, list):
        return [plain(v) for v in obj]
    return obj
