"""Generate `schemas/sglang/flag_history.json`, the server flags of every SGLang release, from each release's parser.

    python scripts/gen_sglang_flags.py --all            # every release of RELEASES (downloads the wheels)
    python scripts/gen_sglang_flags.py --add 0.5.24     # one more release into the shipped history
    python scripts/gen_sglang_flags.py --check          # the installed SGLang's parser == its view of the history
    python scripts/gen_sglang_flags.py --show 0.5.16    # one release's table (JSON) as the history rebuilds it

For each release the wheel is taken from `--wheels` (default /work/wheels, else `pip download --no-deps
sglang==X -d DIR`), its `sglang/` package unpacked, and a child process with that folder first on
`sys.path` imports the release's `ServerArgs.add_cli_args` and records every option: names (the first
long name is the canonical one, the others are aliases), dest, the argparse action kind, value type,
nargs, choices, default, required, deprecated (`build_table`). The tables are stored as one history
(`specctl.schemas.sglang.flags` documents the format and rebuilds any release's table from it): per
flag, spans of releases with the same declaration, each span a delta of the previous one; and the
moves derived from the data (a flag renamed: its dest lives on under a new name; split: a removed
flag's name prefixes flags added in the same release).

Why generated: `specctl validate` must stay torch- and sglang-free and start fast, so it reads this
data instead of importing SGLang; generating it from each release's parser keeps it exactly SGLang's.
Modules a release imports at module level but that building the parser never calls into are stand-in
modules in the child only (`triton` always; the names of STUBS only where the real package is absent;
a name an older release imports from `transformers` that the installed one dropped), and registering a
config `transformers` now ships itself again is allowed; each release's stand-ins are printed.
"""

from __future__ import annotations

import argparse
import importlib.abc
import importlib.machinery
import json
import math
import os
import pickle
import re
import shutil
import subprocess
import sys
import types
import zipfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
OUT = ROOT / "schemas" / "sglang" / "flag_history.json"
GENERATOR = "scripts/gen_sglang_flags.py"
# The releases the history covers: every 0.5.x release and post-release (0.5.0 exists only as release
# candidates), the 0.4.x releases and the last 0.4 post-release. A release whose parser does not load
# here is recorded under "not_loaded" with the reason.
RELEASES = (
    "0.4.0", "0.4.1", "0.4.2", "0.4.3", "0.4.4", "0.4.5", "0.4.6", "0.4.7", "0.4.8", "0.4.9", "0.4.10",
    "0.4.10.post2",
    "0.5.1", "0.5.1.post1", "0.5.1.post2", "0.5.1.post3", "0.5.2", "0.5.3", "0.5.3.post1", "0.5.3.post2",
    "0.5.3.post3", "0.5.4", "0.5.4.post1", "0.5.4.post2", "0.5.4.post3", "0.5.5", "0.5.5.post1", "0.5.5.post2",
    "0.5.5.post3", "0.5.6", "0.5.6.post1", "0.5.6.post2", "0.5.7", "0.5.8", "0.5.8.post1", "0.5.9", "0.5.10",
    "0.5.10.post1", "0.5.11", "0.5.12", "0.5.12.post1", "0.5.13", "0.5.13.post1", "0.5.14", "0.5.15",
    "0.5.15.post1", "0.5.16", "0.5.17", "0.5.18", "0.5.19", "0.5.20", "0.5.21", "0.5.22", "0.5.23",
)
# Top-level modules some releases import at module level that the parser never uses; a stand-in is made
# only when the real one is not installed.
STUBS = ("torchvision", "partial_json_parser", "sgl_kernel", "flashinfer", "vllm", "decord", "outlines",
         "xgrammar", "llguidance", "compressed_tensors", "torchao", "pynvml", "cuda", "zmq", "setproctitle",
         "interegular", "openai", "tiktoken", "sentencepiece", "einops", "datasets", "modelscope", "gguf",
         "soundfile", "av", "blobfile", "hf_transfer", "uvloop", "aiohttp", "fastapi", "uvicorn", "pydantic_core",
         "nvtx", "ray", "triton_kernels", "kernels", "timm", "openai_harmony", "mooncake", "nixl", "deep_gemm",
         "deep_ep", "mori", "quack", "flash_attn", "sgl_fa3", "cutlass", "tvm_ffi", "apache_tvm_ffi",
         "scipy", "numba", "python_multipart", "grpc", "grpcio", "smg_grpc_proto", "opentelemetry",
         "prometheus_client", "librosa", "dill", "cloudpickle", "accelerate", "peft", "msgspec", "ninja",
         "torch_memory_saver", "tabulate", "watchfiles", "sglang_router", "xxhash", "pybase64", "orjson", "httpx")


# -- the child: one release's parser ------------------------------------------------------------------------
# Stand-in functions some releases call at import time: dill.dumps(cls) (pickle does the same for a
# module-level class).
SAME_API: dict[str, dict[str, Any]] = {"dill": {"dumps": pickle.dumps, "loads": pickle.loads}}


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


class _StubMeta(type):
    """A stand-in class: any attribute is another stand-in; called with one function, it returns it
    (decorators); otherwise it makes an instance."""

    def __getattr__(cls, name: str) -> Any:
        if name.startswith("__") and name.endswith("__"):
            raise AttributeError(name)
        return _StubMeta(name, (_Stub,), {})

    def __call__(cls, *args: Any, **kwargs: Any) -> Any:
        if len(args) == 1 and not kwargs and callable(args[0]):
            return args[0]
        return super().__call__()

    def __iter__(cls) -> Any:
        return iter(())

    def __or__(cls, other: Any) -> Any:
        return cls


class _Stub(metaclass=_StubMeta):
    @classmethod
    def __get_pydantic_core_schema__(cls, source: Any, handler: Any) -> Any:  # a field type of a pydantic model
        from pydantic_core import core_schema

        return core_schema.any_schema()

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__") and name.endswith("__"):
            raise AttributeError(name)
        return _StubMeta(name, (_Stub,), {})

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return args[0] if len(args) == 1 and not kwargs and callable(args[0]) else _Stub()

    def __iter__(self) -> Any:
        return iter(())


class _StubModule(types.ModuleType):
    def __getattr__(self, name: str) -> Any:
        if name.startswith("__") and name.endswith("__"):
            raise AttributeError(name)
        return _StubMeta(name, (_Stub,), {})


class _NoDriver:
    """`triton.runtime.driver` of a host without a GPU: reading `.active` raises, as real triton does."""

    @property
    def active(self) -> Any:
        raise RuntimeError("0 active drivers ([]). There should only be one.")


class _StubFinder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Last on sys.meta_path: serves the named modules (and their submodules) that nothing else provides."""

    def __init__(self, names: set[str]) -> None:
        self.names = names

    def find_spec(self, fullname: str, path: Any = None, target: Any = None) -> Any:
        if any(fullname == n or fullname.startswith(n + ".") for n in self.names):
            return importlib.machinery.ModuleSpec(fullname, self, is_package=True)
        return None

    def create_module(self, spec: Any) -> Any:
        mod = _StubModule(spec.name)
        for name, real in SAME_API.get(spec.name, {}).items():
            setattr(mod, name, real)
        mod.__path__ = []  # type: ignore[attr-defined]
        mod.__version__ = "0.0.0"  # type: ignore[attr-defined]
        return mod

    def exec_module(self, module: Any) -> None:
        return None


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


def _refusal(parser: argparse.ArgumentParser, action: argparse.Action, option: str) -> str | None:
    """The error a deprecated action raises when given (some releases' DeprecatedAction refuses the flag
    with its help text), found by calling it on a throw-away namespace; None when it only warns."""
    import contextlib
    import io

    err = io.StringIO()
    try:
        with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(err):
            action(parser, argparse.Namespace(), [] if action.nargs == 0 else None, option)
    except (ValueError, argparse.ArgumentError) as exc:
        return str(exc) or type(exc).__name__
    except SystemExit as exc:  # parser.error(...): argparse's usage message
        lines = [ln for ln in err.getvalue().splitlines() if ln.strip()]
        return re.sub(r"^\S*: error: ", "", lines[-1]) if lines else f"exit {exc.code}"
    except Exception:  # noqa: BLE001 - a store action given no value: not a refusal
        return None
    return None


def build_table() -> dict[str, Any]:
    """The importable SGLang's flag table: {"sglang_version", "generator", "flags": [entry, ...]}."""
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
            "refused": _refusal(parser, action, names[0]) if "Deprecated" in type(action).__name__ else None,
        }
        flags.append(entry)
    return {"sglang_version": sglang.__version__, "generator": GENERATOR, "flags": flags}


def _missing_module(exc: BaseException | None) -> str | None:
    """The STUBS (or `triton`) module an import error is about, or `module:name` for a name a module of the
    installed `transformers` no longer has; following the exception chain."""
    while exc is not None:
        if isinstance(exc, ModuleNotFoundError):
            top = (exc.name or "").split(".")[0]
            if top in STUBS or top == "triton":
                return top
        if isinstance(exc, AttributeError) and str(exc).startswith("module 'triton"):
            return "triton"
        m = re.match(r"cannot import name '(\w+)' from '(transformers[\w.]*)'", str(exc))
        if isinstance(exc, ImportError) and m:  # a name the installed transformers dropped: module:name
            return f"{m.group(2)}:{m.group(1)}"
        exc = exc.__cause__ or exc.__context__
    return None


def _tolerant_registries() -> None:
    """Older releases register model configs and processors that the installed `transformers` now ships
    itself ("'qwen3_asr' is already used by a Transformers config"): registering them again is allowed
    here (`exist_ok=True`); the parser never uses them."""
    import transformers

    for name in ("AutoConfig", "AutoProcessor", "AutoTokenizer", "AutoImageProcessor", "AutoModel",
                 "AutoModelForCausalLM", "AutoFeatureExtractor", "AutoVideoProcessor"):
        try:
            cls = getattr(transformers, name, None)
            register = getattr(cls, "register", None)
        except Exception:  # noqa: BLE001 - a class whose backend is missing is not registered to
            continue
        if register is None:
            continue

        def tolerant(*args: Any, _register: Any = register, **kwargs: Any) -> Any:
            kwargs["exist_ok"] = True
            try:
                return _register(*args, **kwargs)
            except TypeError:  # a register without exist_ok
                kwargs.pop("exist_ok")
                return _register(*args, **kwargs)

        cls.register = staticmethod(tolerant)


NEED_STUB = 4  # the child's exit code when a module of STUBS is missing (its name is the last stderr line)


def child_main(folder: str, stubs: set[str]) -> int:
    """In a child process: the table of the release unpacked in `folder`, as JSON on stdout. A missing
    module that STUBS lists and `stubs` does not yet: exit NEED_STUB naming it (the parent retries)."""
    import contextlib
    import io

    sys.path[:0] = folder.split(os.pathsep)
    sys.meta_path.append(_StubFinder({s for s in stubs if ":" not in s}))
    for entry in (s for s in stubs if ":" in s):  # names of the installed transformers' modules
        module, _, name = entry.partition(":")
        setattr(importlib.import_module(module), name, _StubMeta(name, (_Stub,), {}))
    _tolerant_registries()
    if "triton" in stubs:  # the full stand-in instead of the bare one, with no active driver (as on a CPU host)
        importlib.import_module("triton.runtime").driver = _NoDriver()  # type: ignore[attr-defined]
    try:
        with contextlib.redirect_stdout(io.StringIO()):
            table = build_table()
    except Exception as exc:  # noqa: BLE001 - which module to stand in for, else the error itself
        top = _missing_module(exc)
        if top is not None and top not in stubs:
            sys.stderr.write(f"\n{top}\n")
            return NEED_STUB
        raise
    import sglang

    if not str(Path(sglang.__file__).resolve()).startswith(str(Path(folder.split(os.pathsep)[0]).resolve())):
        raise SystemExit(f"imported {sglang.__file__}, not the release under {folder}")
    table["stubs"] = sorted(stubs)
    sys.stdout.write(json.dumps(table))
    return 0


# -- the parent: wheels, children, the history --------------------------------------------------------------

def wheel_for(version: str, wheels: Path) -> Path:
    found = sorted(wheels.glob(f"sglang-{version}-*.whl"))
    if not found:
        wheels.mkdir(parents=True, exist_ok=True)
        subprocess.run([sys.executable, "-m", "pip", "download", "--quiet", "--no-deps", f"sglang=={version}",
                        "-d", str(wheels)], check=True, stdout=subprocess.DEVNULL)
        found = sorted(wheels.glob(f"sglang-{version}-*.whl"))
    if not found:
        raise RuntimeError(f"no wheel of sglang {version} under {wheels}")
    return found[0]


def unpack(version: str, wheels: Path, work: Path) -> Path:
    dest = work / version
    if (dest / "sglang" / "srt" / "server_args.py").exists():
        return dest
    shutil.rmtree(dest, ignore_errors=True)
    dest.mkdir(parents=True)
    with zipfile.ZipFile(wheel_for(version, wheels)) as z:
        z.extractall(dest, [n for n in z.namelist() if n.startswith("sglang/")])
    return dest


def _run_child(folders: list[Path], timeout: float, seed: list[str]) -> dict[str, Any]:
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "PYTHONDONTWRITEBYTECODE": "1"}
    stubs: list[str] = list(seed)
    while True:
        proc = subprocess.run([sys.executable, __file__, "--child", os.pathsep.join(map(str, folders)),
                               "--stub", ",".join(stubs)], capture_output=True, text=True, timeout=timeout, env=env)
        lines = [ln for ln in proc.stderr.strip().splitlines() if ln.strip()]
        if proc.returncode == NEED_STUB and lines and lines[-1] not in stubs:
            stubs.append(lines[-1])
            continue
        if proc.returncode != 0:
            where = [ln.strip() for ln in lines if ln.strip().startswith('File "')]
            raise RuntimeError((lines[-1] if lines else f"exit {proc.returncode}")
                               + (f" (at {where[-1]})" if where else "") + f" [stand-ins: {','.join(stubs)}]")
        table: dict[str, Any] = json.loads(proc.stdout)
        return table


def release_table(version: str, wheels: Path, work: Path, timeout: float = 600,
                  seed: list[str] | None = None) -> dict[str, Any]:
    """One release's table from a child process (kept under `work` for the next run), offering the
    stand-ins of `seed` from the start (the ones a neighbouring release needed: each retry is a fresh
    import); raises RuntimeError with the child's last error line."""
    cached = work / f"{version}.table.json"
    if cached.exists():
        return dict(json.loads(cached.read_text(encoding="utf-8")))
    folder = unpack(version, wheels, work)
    table = _run_child([folder], timeout, list(seed or ()))
    if table["sglang_version"] != version:
        raise RuntimeError(f"the wheel says it is {table['sglang_version']}")
    cached.write_text(json.dumps(table), encoding="utf-8")
    return table


def collect(versions: list[str], wheels: Path, work: Path, jobs: int,
            seed: tuple[str, ...] = ()) -> tuple[dict[str, Any], dict[str, str]]:
    """The tables of `versions` (newest first is fastest: the stand-ins one release needed are offered
    to the next from the start, beginning with `seed`), and the reasons of those that did not load."""
    tables: dict[str, Any] = {}
    failed: dict[str, str] = {}
    seen: list[str] = list(seed)

    def one(v: str) -> None:
        try:
            tables[v] = release_table(v, wheels, work, seed=list(seen))
            seen.extend(s for s in tables[v].get("stubs") or () if s not in seen)
            stubs = tables[v].get("stubs") or []
            print(f"  {v}: {len(tables[v]['flags'])} flags" + (f", stand-ins: {', '.join(stubs)}" if stubs else ""),
                  file=sys.stderr)
        except (RuntimeError, subprocess.SubprocessError, OSError, zipfile.BadZipFile) as exc:
            failed[v] = str(exc)[:300]
            print(f"  {v}: not loaded: {failed[v]}", file=sys.stderr)

    with ThreadPoolExecutor(max_workers=jobs) as pool:
        list(pool.map(one, versions))
    return tables, failed


def _text(history: dict[str, Any]) -> str:
    return json.dumps(history, separators=(",", ":"), sort_keys=False) + "\n"


def _flags_module() -> Any:
    sys.path.insert(0, str(ROOT.parent))
    from specctl.schemas.sglang import flags

    return flags


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=OUT)
    ap.add_argument("--wheels", type=Path, default=Path(os.environ.get("SGLANG_WHEELS", "/work/wheels")),
                    help="folder of sglang wheels (missing ones are downloaded with pip download --no-deps)")
    ap.add_argument("--work", type=Path, default=Path("/tmp/sglang-releases"), help="where wheels are unpacked")
    ap.add_argument("--jobs", type=int, default=2, help="child processes at once")
    ap.add_argument("--seed-stubs", default="", metavar="A,B", help="stand-ins to offer every release from the "
                    "start (saves one import per missing module; e.g. triton,torchvision,partial_json_parser)")
    what = ap.add_mutually_exclusive_group(required=True)
    what.add_argument("--all", action="store_true", help="rebuild the history from every release of RELEASES "
                      "and of the current history")
    what.add_argument("--add", nargs="+", metavar="VERSION", help="add (or refresh) releases in the history")
    what.add_argument("--check", action="store_true",
                      help="compare the installed SGLang's parser with its release's view of the history; exit 1 "
                           "on a difference")
    what.add_argument("--show", metavar="VERSION", help="print one release's table as the history rebuilds it")
    what.add_argument("--child", metavar="FOLDER", help=argparse.SUPPRESS)
    ap.add_argument("--stub", default="", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.child:
        return child_main(args.child, {s for s in args.stub.split(",") if s})
    flags = _flags_module()
    if args.show:
        sys.stdout.write(json.dumps(flags.release_json(args.show, flags.parse_history(args.out.read_text())),
                                    indent=1) + "\n")
        return 0
    if args.check:
        table = build_table()
        history = flags.parse_history(args.out.read_text(encoding="utf-8"))
        version = table["sglang_version"]
        if version not in history["releases"]:
            print(f"{args.out} has no SGLang {version}; add it: python {GENERATOR} --add {version}", file=sys.stderr)
            return 1
        if flags.release_json(version, history) != {k: table[k] for k in ("sglang_version", "generator", "flags")}:
            print(f"{args.out} differs from SGLang {version}'s parser; regenerate: python {GENERATOR} --add "
                  f"{version}", file=sys.stderr)
            return 1
        print(f"{args.out}: SGLang {version} up to date ({len(table['flags'])} flags)")
        return 0
    old_tables: dict[str, Any] = {}
    old_failed: dict[str, str] = {}
    if args.add and args.out.exists():
        old = flags.parse_history(args.out.read_text(encoding="utf-8"))
        old_tables = {v: flags.release_json(v, old) for v in old["releases"]}
        old_failed = dict(old.get("not_loaded") or {})
    if args.all and args.out.exists():  # releases added with --add since RELEASES was written stay in
        wanted = {*RELEASES, *flags.parse_history(args.out.read_text(encoding="utf-8"))["releases"]}
    else:
        wanted = set(RELEASES if args.all else args.add)
    versions = sorted(wanted, key=lambda v: flags.version_key(v) or (0,) * 5, reverse=True)
    print(f"loading {len(versions)} SGLang release parser(s)", file=sys.stderr)
    tables, failed = collect(versions, args.wheels, args.work, args.jobs,
                             tuple(s for s in args.seed_stubs.split(",") if s))
    if args.add and not tables:
        print("no release loaded; the history is unchanged", file=sys.stderr)
        return 1
    merged = {**old_tables, **tables}
    not_loaded = {v: r for v, r in {**old_failed, **failed}.items() if v not in merged}
    history = flags.build_history(merged, not_loaded, generator=GENERATOR)
    text = _text(history)
    args.out.write_text(text, encoding="utf-8")
    print(f"wrote {args.out}: {len(history['releases'])} releases, {len(history['flags'])} flags, "
          f"{len(text)} bytes; not loaded: {', '.join(not_loaded) or 'none'}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
