"""Generate `schemas/sglang/flags.json`, SGLang's server flag table, from SGLang's own parser.

Run with an environment where `sglang` is installed (`pip install --no-deps sglang==0.5.23` plus the
light packages of scripts/setup.sh): `python scripts/gen_sglang_flags.py [--out FILE] [--check]`.
The table is what `ServerArgs.add_cli_args` declares on an `argparse` parser: every option's names
(the first long name is the canonical one, the others are aliases), the argparse action kind, the
value type, choices, nargs and default. `--check` compares a freshly built table with the shipped
file and exits 1 on any difference (tests/test_sglang_parser.py does the same).

Why generated: `specctl validate` must stay torch- and sglang-free and start fast, so it reads this
data instead of importing SGLang; generating it from the parser keeps it exactly SGLang's.
`triton` is a stub module here: SGLang imports it at module level, but building the parser never
calls into it (RECIPE.md). The stub is installed only in this process.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import types
from pathlib import Path
from typing import Any

OUT = Path(__file__).resolve().parent.parent / "schemas" / "sglang" / "flags.json"


def install_triton_stub() -> None:
    """A bare `triton` module (and `triton.language.dtype`, which torch._dynamo reads at import)."""
    if "triton" in sys.modules:
        return
    try:
        import triton  # noqa: F401  # a real triton is fine too

        return
    except ImportError:
        pass
    tr = types.ModuleType("triton")
    tl = types.ModuleType("triton.language")

    class _Dtype:  # torch._dynamo.utils adds triton.language.dtype to its constant types
        pass

    tl.dtype = _Dtype  # type: ignore[attr-defined]
    tr.language = tl  # type: ignore[attr-defined]
    tr.__version__ = "0.0.0"  # type: ignore[attr-defined]
    sys.modules["triton"] = tr
    sys.modules["triton.language"] = tl


def sglang_parser() -> argparse.ArgumentParser:
    """SGLang's server parser, exactly as `launch_server` builds it (`allow_abbrev=False` for checks)."""
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
    install_triton_stub()
    from sglang.srt.server_args import ServerArgs

    parser = argparse.ArgumentParser(allow_abbrev=False)
    ServerArgs.add_cli_args(parser)
    return parser


def _type_name(t: Any) -> str:
    if t is None:
        return "str"
    name = getattr(t, "__name__", "")
    if name in ("str", "int", "float"):
        return name
    if name in ("human_readable_int",):
        return "int"
    if name == "loads":
        return "json"
    if name == "json_list_type":
        return "json"
    return name or "str"


def _json_default(v: Any) -> Any:
    if v is None or isinstance(v, (bool, int, str)):
        return v
    if isinstance(v, float):
        return v if math.isfinite(v) else None
    if isinstance(v, (list, tuple)):
        return [_json_default(x) for x in v]
    if isinstance(v, dict):
        return {str(k): _json_default(x) for k, x in v.items()}
    return repr(v)


def _kind(action: argparse.Action) -> str:
    name = type(action).__name__
    if isinstance(action, argparse.BooleanOptionalAction):
        return "bool_optional"
    if name in ("_StoreTrueAction", "DeprecatedStoreTrueAction"):
        return "store_true"
    if name == "_StoreFalseAction":
        return "store_false"
    if name in ("_StoreConstAction", "DeprecatedStoreConstAction"):
        return "store_const"
    if name == "_AppendAction":
        return "append"
    return "store"


def build_table() -> dict[str, Any]:
    parser = sglang_parser()
    import sglang  # after the parser: importing sglang needs the triton stub
    flags: list[dict[str, Any]] = []
    for action in parser._actions:
        if isinstance(action, argparse._HelpAction):
            continue
        names = [s for s in action.option_strings if s.startswith("--")]
        if not names:
            continue
        kind = _kind(action)
        entry: dict[str, Any] = {
            "name": names[0],
            "aliases": names[1:],
            "dest": action.dest,
            "kind": kind,
            "type": None if kind in ("store_true", "store_false", "store_const", "bool_optional")
            else _type_name(action.type),
            "nargs": action.nargs if isinstance(action.nargs, (str, int, type(None))) else str(action.nargs),
            # sorted: some choice lists come from registries filled in import order, which varies by process
            "choices": sorted((_json_default(c) for c in action.choices), key=str)
            if action.choices is not None else None,
            "default": _json_default(action.default),
            "required": bool(action.required),
            "deprecated": "Deprecated" in type(action).__name__,
        }
        if kind not in ("store", "append", "store_true", "store_false", "store_const", "bool_optional"):
            entry["kind"] = "store"
        flags.append(entry)
    return {"sglang_version": sglang.__version__, "generator": "scripts/gen_sglang_flags.py", "flags": flags}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=OUT)
    ap.add_argument("--check", action="store_true", help="compare with the shipped table; exit 1 on a difference")
    args = ap.parse_args(argv)
    table = build_table()
    text = json.dumps(table, indent=1, sort_keys=False) + "\n"
    if args.check:
        shipped = args.out.read_text(encoding="utf-8") if args.out.exists() else ""
        if shipped != text:
            print(f"{args.out} differs from SGLang {table['sglang_version']}'s parser; regenerate it", file=sys.stderr)
            return 1
        print(f"{args.out}: up to date with SGLang {table['sglang_version']} ({len(table['flags'])} flags)")
        return 0
    args.out.write_text(text, encoding="utf-8")
    print(f"wrote {args.out}: {len(table['flags'])} flags of SGLang {table['sglang_version']}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
