"""engine/alloc.py: a step's large temporaries stop faulting in fresh pages once the allocator is tuned.

Each case runs in a child process (the tuning is process-wide and once per process): it tunes (or not),
then allocates and frees three 2 MiB zero-filled blocks 20 times, the shape of a verify's temporaries, and
counts the minor page faults that loop took (`getrusage`)."""

from __future__ import annotations

import json
import os
import platform
import subprocess
import sys
from typing import Any

import pytest

PROBE = """
import json, resource
from specctl.engine.alloc import tune_allocator
t = tune_allocator()
def faults():
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt
def step():
    live = [bytearray(2 << 20) for _ in range(3)]
    del live
step()
f0 = faults()
for _ in range(20):
    step()
print(json.dumps({"applied": t.applied, "reason": t.reason, "faults": faults() - f0}))
"""

glibc = pytest.mark.skipif(platform.system() != "Linux" or platform.libc_ver()[0] != "glibc",
                           reason="mallopt is glibc's")


def probe(**env: str) -> dict[str, Any]:
    base = {k: v for k, v in os.environ.items()
            if k not in ("SPECCTL_MALLOC_TUNING", "MALLOC_MMAP_THRESHOLD_", "MALLOC_TRIM_THRESHOLD_")}
    out = subprocess.run([sys.executable, "-c", PROBE], env={**base, **env}, capture_output=True, text=True,
                         timeout=60, check=True)
    result: dict[str, Any] = json.loads(out.stdout)
    return result


@glibc
def test_tuned_allocator_reuses_large_blocks() -> None:
    tuned = probe()
    untuned = probe(SPECCTL_MALLOC_TUNING="0")
    assert tuned["applied"] is True and untuned["applied"] is False
    assert untuned["reason"] == "SPECCTL_MALLOC_TUNING=0"
    # untuned: 6 MiB of fresh pages per step (~1,500 faults); tuned: the freed blocks are reused
    assert untuned["faults"] > 20 * 1000
    assert tuned["faults"] < untuned["faults"] // 20


@glibc
def test_glibc_variables_set_by_the_user_win() -> None:
    got = probe(MALLOC_TRIM_THRESHOLD_="131072")
    assert got["applied"] is False
    assert "MALLOC_TRIM_THRESHOLD_" in str(got["reason"])


def test_engine_reports_the_tuning() -> None:
    from specctl.engine.config import EngineConfig
    from specctl.engine.engine import Engine

    stats = Engine(EngineConfig(model_ref="builtin:tiny-draft", max_tokens=256, max_batch_size=1)).stats()
    assert set(stats["allocator"]) == {"applied", "reason", "mmap_threshold", "trim_threshold"}
    untouched = not any(k in os.environ for k in ("SPECCTL_MALLOC_TUNING", "MALLOC_MMAP_THRESHOLD_",
                                                  "MALLOC_TRIM_THRESHOLD_"))
    if platform.system() == "Linux" and platform.libc_ver()[0] == "glibc" and untouched:
        assert stats["allocator"]["applied"] is True
    if stats["allocator"]["applied"]:
        assert stats["allocator"]["mmap_threshold"] == 32 << 20
