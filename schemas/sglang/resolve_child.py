"""SGLang's own start-up resolution for a declared GPU, run on a machine without one (a child script).

Run it only as a script, by path, with the interpreter of the SGLang to use:
`PYTHON resolve_child.py`. It imports nothing from specctl (that interpreter may not have it) and is
never imported by `specctl validate`.

The device is declared *below* SGLang: `torch.cuda` answers as one of GPUS (name, memory, compute
capability, SM count), a fake `nvidia-smi` is first on PATH, and the GPU-only packages SGLang imports
(`sgl_kernel`, `flashinfer`, `torchvision`, `pynvml`, `triton`, where not installed) are import stand-ins.
No SGLang name is patched: whatever SGLang decides, it decides with its own code. Resolution covers the
argument checks only (not memory fit, weights, ports or network devices).

One child declares one GPU for its whole life (`--gpu H100`, the default): SGLang caches what it asks
the device, at import and in `lru_cache`s, so a second GPU needs a second child.

Protocol (JSON lines). The child writes `{"ready": true, "sglang": VERSION, "python": PATH}` once SGLang
is imported (or `{"ready": false, "error": {...}}` and exits 0). Then per input line
`{"id": ANY, "argv": [...], "env": {VAR: VALUE}, "timeout": SECONDS}` it answers one line
`{"id", "ok": bool, "error": null | {"type", "message", "site": "sglang/...py:LINE", "function"},
"resolved": {ServerArgs field: JSON-safe value}, "seconds"}`. Each case runs in a forked process
(`prepare_server_args(argv)` then `ServerArgs.resolve_once()`), so cases never see each other's state;
a case that crashes or outlives its timeout is answered with error type `Crash` / `Timeout`. The
modules a case imported are then imported by the child itself (import only), so later cases start warm;
`env` is applied in the case's process, before SGLang reads it at call time.
The protocol uses a private copy of stdout: everything SGLang prints goes to stderr.
"""

from __future__ import annotations

import argparse
import enum
import importlib
import importlib.abc
import importlib.machinery
import importlib.util
import json
import os
import select
import signal
import sys
import tempfile
import time
import traceback
import types
from collections.abc import Sequence
from typing import IO, Any

os.environ["HF_HUB_OFFLINE"] = "1"
os.environ["TRANSFORMERS_OFFLINE"] = "1"
# argparse asks for the terminal size once per flag (500+ per case); a fixed size answers at once.
os.environ.setdefault("COLUMNS", "120")
os.environ.setdefault("LINES", "40")


class GpuSpec:
    """One GPU model as the CUDA runtime and `nvidia-smi` describe it (SXM parts)."""

    def __init__(self, name: str, total_memory: int, major: int, minor: int, sm_count: int, smi_mib: int) -> None:
        self.name = name
        self.total_memory = total_memory
        self.major = major
        self.minor = minor
        self.multi_processor_count = sm_count
        self.smi_mib = smi_mib


GPUS: dict[str, GpuSpec] = {
    "H100": GpuSpec("NVIDIA H100 80GB HBM3", 85520809984, 9, 0, 132, 81559),
    "H200": GpuSpec("NVIDIA H200", 150754820096, 9, 0, 132, 143771),
    "B200": GpuSpec("NVIDIA B200", 192265846784, 10, 0, 148, 183359),
}
GPU_COUNT = 8  # one node of eight, as these parts ship
CUDA_VERSION = "12.9"
DRIVER_VERSION = "575.57.08"
FLASHINFER_VERSION = "0.6.3"
TRITON_VERSION = "3.8.0"
STAND_IN_ROOTS = ("sgl_kernel", "flashinfer", "torchvision", "pynvml", "triton")

_gpu: GpuSpec = GPUS["H100"]


# --- the device, declared below SGLang ------------------------------------------------------------------


class _Props:
    """What `torch.cuda.get_device_properties` returns, for the declared GPU."""

    def __init__(self, spec: GpuSpec) -> None:
        self.name = spec.name
        self.total_memory = spec.total_memory
        self.major = spec.major
        self.minor = spec.minor
        self.multi_processor_count = spec.multi_processor_count
        self.L2_cache_size = 50 * 1024 * 1024
        self.is_integrated = False
        self.is_multi_gpu_board = False
        self.warp_size = 32
        self.max_threads_per_multi_processor = 2048
        self.regs_per_multiprocessor = 65536
        self.shared_memory_per_block_optin = 232448
        self.gcnArchName = ""
        self.uuid = "GPU-00000000-0000-0000-0000-000000000000"

    def __repr__(self) -> str:
        return f"_CudaDeviceProperties(name='{self.name}', major={self.major}, minor={self.minor})"


def _declare_torch_cuda(torch: Any) -> None:
    def props(device: Any = None) -> _Props:
        return _Props(_gpu)

    torch.cuda.is_available = lambda: True
    torch.cuda.device_count = lambda: GPU_COUNT
    torch.cuda.current_device = lambda: 0
    torch.cuda.get_device_properties = props
    torch.cuda.get_device_name = lambda device=None: _gpu.name
    torch.cuda.get_device_capability = lambda device=None: (_gpu.major, _gpu.minor)
    torch.cuda.mem_get_info = lambda device=None: (_gpu.total_memory - (1 << 30), _gpu.total_memory)
    torch.cuda.is_bf16_supported = lambda *a, **k: True
    torch.version.cuda = CUDA_VERSION


_NVIDIA_SMI = """#!/bin/sh
# nvidia-smi for the declared GPU: answers the queries SGLang's start-up makes.
for a in "$@"; do
  case "$a" in
    --query-gpu=*) q="${a#--query-gpu=}";;
  esac
done
i=0
while [ $i -lt "${SPECCTL_GPU_COUNT:-8}" ]; do
  case "$q" in
    memory.total) echo "$SPECCTL_GPU_MIB";;
    compute_cap) echo "$SPECCTL_GPU_CC";;
    driver_version) echo "$SPECCTL_GPU_DRIVER";;
    name) echo "$SPECCTL_GPU_NAME";;
    *) echo "$SPECCTL_GPU_NAME";;
  esac
  i=$((i+1))
done
"""


def _install_nvidia_smi() -> str:
    folder = tempfile.mkdtemp(prefix="specctl-nvsmi-")
    path = os.path.join(folder, "nvidia-smi")
    with open(path, "w", encoding="utf-8") as fh:
        fh.write(_NVIDIA_SMI)
    os.chmod(path, 0o755)
    os.environ["PATH"] = folder + os.pathsep + os.environ.get("PATH", "")
    return folder


def _select_gpu(name: str) -> None:
    global _gpu
    _gpu = GPUS[name]
    os.environ["SPECCTL_GPU_MIB"] = str(_gpu.smi_mib)
    os.environ["SPECCTL_GPU_CC"] = f"{_gpu.major}.{_gpu.minor}"
    os.environ["SPECCTL_GPU_NAME"] = _gpu.name
    os.environ["SPECCTL_GPU_DRIVER"] = DRIVER_VERSION
    os.environ["SPECCTL_GPU_COUNT"] = str(GPU_COUNT)


# --- import stand-ins for the GPU-only packages ---------------------------------------------------------


class _StandInMeta(type):
    def __getattr__(cls, name: str) -> Any:
        if name.startswith("__") and name.endswith("__"):
            raise AttributeError(name)
        return _stand_in_class(name)

    def __getitem__(cls, item: Any) -> Any:
        return cls


class _StandIn(metaclass=_StandInMeta):
    """Any name of a stand-in package: a class that can be subclassed, called, decorated with, indexed."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        self._wrapped = args[0] if len(args) == 1 and callable(args[0]) and not kwargs else None

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        if len(args) == 1 and callable(args[0]) and not kwargs:
            return args[0]  # decorator use: keep the function
        return _StandIn()

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__") and name.endswith("__"):
            raise AttributeError(name)
        return _StandIn()

    def __getitem__(self, item: Any) -> Any:
        return self

    def __bool__(self) -> bool:
        return False

    def __iter__(self) -> Any:
        return iter(())


def _stand_in_class(name: str) -> type:
    return _StandInMeta(name, (_StandIn,), {})


class _StandInModule(types.ModuleType):
    def __getattr__(self, name: str) -> Any:
        if name.startswith("__") and name.endswith("__"):
            raise AttributeError(name)
        if name[:1].islower():  # a function or a value: callable, decorator-friendly, any attribute
            return _StandIn()
        return _stand_in_class(name)


class _TritonDriver:
    def get_current_target(self) -> Any:
        return types.SimpleNamespace(backend="cuda", arch=_gpu.major * 10 + _gpu.minor, warp_size=32)

    def get_current_device(self) -> int:
        return 0


class _StandInFinder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Serves `ROOT` and `ROOT.*` for each stand-in root that is not installed."""

    def __init__(self, roots: Sequence[str]) -> None:
        self.roots = tuple(roots)

    def find_spec(self, fullname: str, path: Any = None, target: Any = None) -> importlib.machinery.ModuleSpec | None:
        if fullname.split(".", 1)[0] not in self.roots:
            return None
        return importlib.machinery.ModuleSpec(fullname, self, is_package=True)

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> types.ModuleType:
        mod = _StandInModule(spec.name)
        mod.__path__ = []
        mod.__file__ = f"<specctl stand-in {spec.name}>"
        return mod

    def exec_module(self, module: types.ModuleType) -> None:
        name = module.__name__
        attrs: dict[str, Any] = {}
        if name == "flashinfer":
            attrs["__version__"] = FLASHINFER_VERSION
        elif name == "triton":
            attrs["__version__"] = TRITON_VERSION
        elif name == "triton.runtime":  # triton's driver names the device's backend and arch
            attrs["driver"] = types.SimpleNamespace(active=_TritonDriver())
        elif name == "triton.language":
            attrs["dtype"] = _stand_in_class("dtype")
            attrs["constexpr"] = _stand_in_class("constexpr")
        elif name in ("sgl_kernel", "torchvision"):
            attrs["__version__"] = "0.0.0"
        for key, value in attrs.items():
            setattr(module, key, value)
        if name == "triton":
            importlib.import_module("triton.runtime")


def _missing(roots: Sequence[str]) -> list[str]:
    out = []
    for root in roots:
        try:
            if importlib.util.find_spec(root) is None:
                out.append(root)
        except (ImportError, ValueError):
            out.append(root)
    return out


def install_device(gpu: str) -> list[str]:
    """Declare the device below SGLang; answer the stand-in roots installed."""
    import torch  # noqa: PLC0415 - torch: SGLang's interpreter's, loaded only for the check that reads it

    # torch probes for triton once and caches the answer: let it see the truth (absent) first, so a
    # stand-in triton for SGLang's imports does not send torch's compiler down its triton paths.
    try:
        import torch.utils._triton as torch_triton  # noqa: PLC0415 - torch: SGLang's interpreter's, loaded only for the check that reads it

        torch_triton.has_triton_package()
        torch_triton.has_triton()
    except Exception:
        pass
    _declare_torch_cuda(torch)
    _install_nvidia_smi()
    _select_gpu(gpu)
    roots = _missing(STAND_IN_ROOTS)
    if roots:
        sys.meta_path.insert(0, _StandInFinder(roots))
    return roots


# --- one case ------------------------------------------------------------------------------------------


class UsageError(Exception):
    """argparse's refusal (it would print usage and exit 2)."""


def _argparse_raises() -> None:
    def error(self: argparse.ArgumentParser, message: str) -> Any:
        raise UsageError(message)

    argparse.ArgumentParser.error = error  # type: ignore[method-assign]


def _json_safe(value: Any, depth: int = 0) -> Any:
    if depth > 6:
        return str(value)
    if value is None or isinstance(value, (bool, int, str)):
        return value
    if isinstance(value, float):
        return value if value == value and value not in (float("inf"), float("-inf")) else str(value)
    if isinstance(value, enum.Enum):
        return _json_safe(value.value, depth + 1)
    if isinstance(value, dict):
        return {str(k): _json_safe(v, depth + 1) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_json_safe(v, depth + 1) for v in value]
    if isinstance(value, (set, frozenset)):
        return sorted((_json_safe(v, depth + 1) for v in value), key=str)
    return str(value)


def _site(exc: BaseException, sglang_root: str) -> tuple[str, str]:
    """The innermost SGLang frame of the traceback: ("sglang/...py:LINE", function)."""
    site, func = "", ""
    tb = exc.__traceback__
    for frame, line in traceback.walk_tb(tb):
        fname = frame.f_code.co_filename
        if fname.startswith(sglang_root + os.sep):
            rel = os.path.relpath(fname, os.path.dirname(sglang_root))
            site, func = f"{rel}:{line}", frame.f_code.co_name
    return site, func


def run_case(case: dict[str, Any], sglang_root: str) -> dict[str, Any]:
    """`prepare_server_args(argv)` + `resolve_once()` in this (forked) process."""
    prepare_server_args = importlib.import_module("sglang.srt.server_args").prepare_server_args

    for key, val in (case.get("env") or {}).items():
        os.environ[str(key)] = str(val)
    argv = [str(a) for a in case.get("argv") or []]
    try:
        sa = prepare_server_args(argv)
        sa.resolve_once()
        resolved = _json_safe(sa.resolved_dict())
        return {"ok": True, "error": None, "resolved": resolved}
    except BaseException as exc:  # SystemExit, KeyboardInterrupt in SGLang's code are verdicts too
        site, func = _site(exc, sglang_root)
        message = str(exc) if not isinstance(exc, SystemExit) else f"exit {exc.code}"
        return {"ok": False, "resolved": {},
                "error": {"type": type(exc).__name__, "message": message[:4000], "site": site, "function": func}}


def _fork_case(case: dict[str, Any], sglang_root: str, timeout: float) -> dict[str, Any]:
    rfd, wfd = os.pipe()
    pid = os.fork()
    if pid == 0:  # the case's own process
        os.close(rfd)
        code = 0
        try:
            before = set(sys.modules)
            answer = run_case(case, sglang_root)
            answer["imported"] = sorted(set(sys.modules) - before)
            data = json.dumps(answer).encode()
        except BaseException as exc:
            data = json.dumps(_failure("ProtocolError", f"{type(exc).__name__}: {exc}")).encode()
            code = 1
        view = memoryview(data)
        while view:
            n = os.write(wfd, view)
            view = view[n:]
        os.close(wfd)
        os._exit(code)
    os.close(wfd)
    chunks: list[bytes] = []
    deadline = time.monotonic() + timeout
    timed_out = False
    while True:
        left = deadline - time.monotonic()
        if left <= 0:
            timed_out = True
            break
        ready, _, _ = select.select([rfd], [], [], left)
        if not ready:
            continue
        chunk = os.read(rfd, 1 << 16)
        if not chunk:
            break
        chunks.append(chunk)
    os.close(rfd)
    if timed_out:
        os.kill(pid, signal.SIGKILL)
    _, status = os.waitpid(pid, 0)
    if timed_out:
        return _failure("Timeout", f"resolution did not finish within {timeout:g} s")
    try:
        return dict(json.loads(b"".join(chunks)))
    except ValueError:
        how = f"signal {os.WTERMSIG(status)}" if os.WIFSIGNALED(status) else f"exit {os.WEXITSTATUS(status)}"
        return _failure("Crash", f"the resolution process ended ({how}) without an answer")


def _failure(kind: str, message: str) -> dict[str, Any]:
    return {"ok": False, "resolved": {}, "error": {"type": kind, "message": message, "site": "", "function": ""}}


def _write(out: IO[str], obj: dict[str, Any]) -> None:
    out.write(json.dumps(obj) + "\n")
    out.flush()


def _warm(names: Sequence[str]) -> None:
    """Import what a case imported, so that the next case's process starts with it."""
    for name in names:
        if name in sys.modules:
            continue
        try:
            importlib.import_module(name)
        except BaseException:  # a module that cannot import here is imported (or not) by the case again
            pass


def main(argv: Sequence[str] | None = None) -> int:
    args = argparse.ArgumentParser(description="SGLang start-up resolution for a declared GPU (JSON lines).")
    args.add_argument("--gpu", default="H100", choices=sorted(GPUS))
    gpu = args.parse_args(argv).gpu
    out = os.fdopen(os.dup(1), "w", encoding="utf-8")
    os.dup2(2, 1)  # SGLang's prints go to stderr; the protocol keeps the private copy
    sys.stdout = sys.stderr
    try:
        install_device(gpu)
        _argparse_raises()
        sglang = importlib.import_module("sglang")
        for shared in ("sglang.srt.server_args", "sglang.srt.arg_groups.pipeline"):  # what every case imports
            importlib.import_module(shared)

        version = str(getattr(sglang, "__version__", "unknown"))
        sglang_root = os.path.dirname(os.path.abspath(str(sglang.__file__)))
    except BaseException as exc:
        traceback.print_exc()
        _write(out, {"ready": False, "error": {"type": type(exc).__name__, "message": str(exc)[:4000],
                                              "site": "", "function": ""}})
        return 0
    _write(out, {"ready": True, "sglang": version, "python": sys.executable, "gpu": gpu})
    for line in sys.stdin:
        if not line.strip():
            continue
        case = json.loads(line)
        start = time.monotonic()
        answer = _fork_case(case, sglang_root, float(case.get("timeout") or 30.0))
        _warm(answer.pop("imported", ()))
        answer["id"] = case.get("id")
        answer["seconds"] = round(time.monotonic() - start, 3)
        _write(out, answer)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
