"""Keep the engine's large CPU temporaries on the heap instead of fresh `mmap` pages (glibc only).

glibc serves an allocation at or above `M_MMAP_THRESHOLD` (128 KiB at start; it creeps up only to the
size of the largest mmapped block freed so far) with a new anonymous mapping, and unmaps it on free; the
heap's top is trimmed back to the OS once more than `M_TRIM_THRESHOLD` of it is free. Either way the next
allocation of that size faults in zeroed pages again. A serving step allocates and frees the same large
temporaries every step (a mamba verify's per-position states: [batch, positions, heads, head_dim, state];
attention's gathered keys and values at large batch), so it paid those page faults on every step, most visibly
in a mamba verify's recurrence (`benchmarks/verify_bench.py`; figures in benchmarks/RESULTS.md).

`tune_allocator()` raises both thresholds once per process (32 MiB mmap threshold, 64 MiB trim
threshold: glibc's own ceiling for its dynamic threshold, and twice that, the ratio glibc keeps). Larger
blocks (a big model's weights, the KV pool) still get their own mappings. The cost is that up to the
trim threshold of freed heap can stay resident. It does nothing where the user set glibc's own
`MALLOC_MMAP_THRESHOLD_` / `MALLOC_TRIM_THRESHOLD_` variables (theirs win), with `SPECCTL_MALLOC_TUNING=0`,
or off glibc (macOS, musl, Windows). Torch-free.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os
import platform
from collections.abc import Mapping
from dataclasses import dataclass

M_TRIM_THRESHOLD = -1  # glibc <malloc.h>
M_MMAP_THRESHOLD = -3
MMAP_THRESHOLD = 32 << 20
TRIM_THRESHOLD = 64 << 20
OPT_OUT_ENV = "SPECCTL_MALLOC_TUNING"
GLIBC_ENV = ("MALLOC_MMAP_THRESHOLD_", "MALLOC_TRIM_THRESHOLD_")


@dataclass(frozen=True)
class AllocatorTuning:
    applied: bool
    reason: str  # what was done, or why not
    mmap_threshold: int | None = None
    trim_threshold: int | None = None

    def to_json(self) -> dict[str, object]:
        return {"applied": self.applied, "reason": self.reason, "mmap_threshold": self.mmap_threshold,
                "trim_threshold": self.trim_threshold}


_done: AllocatorTuning | None = None


def tune_allocator() -> AllocatorTuning:
    """Raise glibc's mmap and trim thresholds for this process (the first call does it; later ones report)."""
    global _done
    if _done is None:
        _done = _tune(os.environ)
    return _done


def _tune(env: Mapping[str, str]) -> AllocatorTuning:
    if env.get(OPT_OUT_ENV, "1").strip().lower() in ("0", "false", "no", "off"):
        return AllocatorTuning(False, f"{OPT_OUT_ENV}={env[OPT_OUT_ENV]}")
    set_by_user = [name for name in GLIBC_ENV if name in env]
    if set_by_user:
        return AllocatorTuning(False, f"left to {', '.join(set_by_user)} (set in the environment)")
    if platform.system() != "Linux" or platform.libc_ver()[0] != "glibc":
        return AllocatorTuning(False, "not glibc")
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        mallopt = libc.mallopt
    except (OSError, AttributeError) as exc:
        return AllocatorTuning(False, f"no mallopt: {exc}")
    mallopt.argtypes = (ctypes.c_int, ctypes.c_int)
    mallopt.restype = ctypes.c_int
    # Trim first: were the mmap threshold to take and the trim one not, freed blocks would stay mapped
    # without the heap growing past what glibc already trims.
    if mallopt(M_TRIM_THRESHOLD, TRIM_THRESHOLD) != 1 or mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD) != 1:
        return AllocatorTuning(False, "mallopt refused the thresholds")
    return AllocatorTuning(True, "glibc mallopt", MMAP_THRESHOLD, TRIM_THRESHOLD)
