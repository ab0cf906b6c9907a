"""Device and dtype names of a deployment mapped to torch objects.

`device: auto` means CUDA when torch sees a GPU, else CPU; nothing on the CPU path is CUDA-only.
dtype names are the deployment's: float32 | bfloat16 | float16 (plus the short aliases fp32/bf16/fp16).
"""

from __future__ import annotations

import torch

from specctl.errors import UsageError

DTYPES: dict[str, torch.dtype] = {
    "float32": torch.float32,
    "fp32": torch.float32,
    "bfloat16": torch.bfloat16,
    "bf16": torch.bfloat16,
    "float16": torch.float16,
    "fp16": torch.float16,
}


def resolve_dtype(name: str | torch.dtype) -> torch.dtype:
    if isinstance(name, torch.dtype):
        return name
    try:
        return DTYPES[str(name).lower()]
    except KeyError:
        raise UsageError(f"unknown dtype {name!r}", hint="one of float32, bfloat16, float16") from None


def dtype_name(dtype: torch.dtype) -> str:
    return {torch.float32: "float32", torch.bfloat16: "bfloat16", torch.float16: "float16"}[dtype]


def resolve_device(name: str | torch.device = "auto") -> torch.device:
    """`auto` -> cuda if available else cpu; `cuda[:N]` must exist on this host."""
    if isinstance(name, torch.device):
        return name
    name = str(name).lower()
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        dev = torch.device(name)
    except RuntimeError:
        raise UsageError(f"unknown device {name!r}", hint="one of auto, cpu, cuda, cuda:N") from None
    if dev.type == "cuda":
        if not torch.cuda.is_available():
            raise UsageError(f"device {name!r} requested but torch sees no CUDA device", hint="use device: auto or cpu")
        if dev.index is not None and dev.index >= torch.cuda.device_count():
            raise UsageError(f"device {name!r} does not exist ({torch.cuda.device_count()} CUDA devices)")
    elif dev.type != "cpu":
        raise UsageError(f"unsupported device {name!r}", hint="one of auto, cpu, cuda, cuda:N")
    return dev
