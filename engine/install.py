"""Whether this environment has the builtin engine: `pip install specctl` is the tool (no torch);
`pip install "specctl[engine]"` adds the engine's packages.

Contract: `ENGINE_MODULES` are the import names the `engine` extra provides. `missing_engine_modules()` lists
those that do not import here (found by `importlib.util.find_spec`, nothing is imported).
`require_engine(what)` raises `UsageError` (exit 2) naming `what`, the missing modules and the extra to
install when any is missing; `engine_error(exc)` turns a `ModuleNotFoundError` for one of them into that same
error (None for any other module), so a command that reaches the engine without a check still answers with
the install line, never a traceback. Torch-free, and cheap: every CLI command may call it.
"""

from __future__ import annotations

import importlib.util

from specctl.errors import UsageError

ENGINE_MODULES = ("torch", "safetensors", "tokenizers", "zmq", "msgspec")
ENGINE_EXTRA = "engine"
INSTALL_HINT = ('pip install "specctl[engine]" (bring your own torch first, e.g. the CPU build torch==2.13.0, '
                "or a CUDA build for a GPU; scripts/setup.sh installs both)")


def missing_engine_modules() -> list[str]:
    missing = []
    for name in ENGINE_MODULES:
        try:
            found = importlib.util.find_spec(name) is not None
        except (ImportError, ValueError):
            found = False
        if not found:
            missing.append(name)
    return missing


def _error(what: str, missing: list[str]) -> UsageError:
    return UsageError(f"{what} runs specctl's builtin engine, which needs {', '.join(missing)}: not installed "
                      f"here (this is the tool install, without the '{ENGINE_EXTRA}' extra)", hint=INSTALL_HINT)


def require_engine(what: str) -> None:
    """UsageError (exit 2) naming the extra to install when the builtin engine's packages are missing."""
    missing = missing_engine_modules()
    if missing:
        raise _error(what, missing)


def engine_error(exc: ModuleNotFoundError, what: str = "this command") -> UsageError | None:
    """The install error for a missing engine module; None when `exc` is about another module."""
    root = (exc.name or "").split(".", 1)[0]
    return _error(what, [root]) if root in ENGINE_MODULES else None
