"""A labelled step-cost ESTIMATE from NVIDIA's aiconfigurator (the optional extra `specctl[aiconfigurator]`),
for when no GPU is at hand to measure one.

Contract:

- `estimate_costs(model, system, batch_sizes, steps, ...)`: per (batch size B, steps K), aiconfigurator's
  static generation estimate (`cli_estimate(mode="static_gen")`) of one decode step of B requests with K
  draft positions (its MTP model, `nextn=K`) and none of them accepted (`nextn_accepted=0`, so its time
  per output token is the time of one step), after `isl` prompt tokens, on `system` (a GPU it has a
  performance database for, e.g. h100_sxm) for `backend` (sglang, vllm or trtllm). The result is a
  `CostModel` whose `meta["estimate"]` says what estimated it and for what, which `tune` prints: it is
  aiconfigurator's model of a GPU, not a measurement, and its MTP drafting stands for whatever drafter
  the deployment runs.
- Offline only: `model` must be one of the model configs aiconfigurator ships (a Hugging Face id such as
  `Qwen/Qwen3-8B`) or a local directory with a `config.json`; anything else is refused before
  aiconfigurator is called (it would fetch the config from the hub).
- `AIC_VERSION` is the release this was written against; another installed version is used and named in
  the label. Torch-free.
"""

from __future__ import annotations

import importlib
import importlib.metadata
import importlib.resources
import logging
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from specctl.adaptive.tune import CostModel
from specctl.errors import UsageError

AIC_VERSION = "0.12.0"
BACKENDS = ("sglang", "vllm", "trtllm")
DECODE_TOKENS = 8  # output tokens of each static estimate: the step time barely moves with it


def installed_version() -> str:
    """aiconfigurator's installed version, or a UsageError saying how to install the extra."""
    try:
        return importlib.metadata.version("aiconfigurator")
    except importlib.metadata.PackageNotFoundError:
        raise UsageError("aiconfigurator is not installed (the estimate needs it)",
                         hint=f'pip install "specctl[aiconfigurator]" (aiconfigurator=={AIC_VERSION}; no torch)') \
            from None


def bundled_models() -> list[str]:
    """The model ids aiconfigurator ships configs for (answered offline)."""
    root = importlib.resources.files("aiconfigurator_core") / "model_configs"
    out = []
    for entry in root.iterdir():
        name = entry.name
        if name.endswith("_config.json") and not name.endswith("_quant_config.json"):
            out.append(name[: -len("_config.json")].replace("--", "/", 1))
    return sorted(out)


def systems() -> list[str]:
    """The GPU systems aiconfigurator has a description for."""
    root = importlib.resources.files("aiconfigurator_core") / "systems"
    data = {e.name for e in (root / "data").iterdir()}
    return sorted(e.name[:-5] for e in root.iterdir() if e.name.endswith(".yaml") and e.name[:-5] in data)


def _check_offline(model: str, system: str, backend: str) -> None:
    local = Path(model)
    if not (local.is_dir() and (local / "config.json").is_file()) and model not in bundled_models():
        known = ", ".join(bundled_models()[:12])
        raise UsageError(f"{model!r}: aiconfigurator ships no config for it and it is no local model directory; it "
                         "would be fetched from the hub, which specctl never does",
                         hint=f"pass a local model directory with config.json, or one of its models ({known}, ...)")
    if system not in systems():
        raise UsageError(f"--aiconfigurator-system {system!r}: not a system aiconfigurator describes",
                         hint=f"one of: {', '.join(systems())}")
    if backend not in BACKENDS:
        raise UsageError(f"--aiconfigurator-backend {backend!r}: expected one of {', '.join(BACKENDS)}")


def estimate_costs(model: str, system: str, batch_sizes: Sequence[int], steps: Sequence[int], *,
                   backend: str = "sglang", isl: int = 512, tp_size: int = 1,
                   progress: Callable[[str], None] | None = None) -> CostModel:
    """aiconfigurator's estimate of every (batch size, steps) point, labelled (module docstring)."""
    version = installed_version()
    _check_offline(model, system, backend)
    cli_estimate = importlib.import_module("aiconfigurator.cli.api").cli_estimate

    logging.getLogger("aiconfigurator").setLevel(logging.ERROR)
    table: dict[int, dict[int, float]] = {}
    db_version: Any = None
    for b in batch_sizes:
        for k in steps:
            try:
                r = cli_estimate(model_path=model, system_name=system, mode="static_gen", backend_name=backend,
                                 batch_size=b, isl=isl, osl=DECODE_TOKENS, tp_size=tp_size, nextn=k,
                                 nextn_accepted=0.0 if k > 0 else None)
            except Exception as exc:  # aiconfigurator's own errors: unsupported combination, missing data
                raise UsageError(f"aiconfigurator cannot estimate {model} on {system} ({backend}) at batch {b}, "
                                 f"steps {k}: {type(exc).__name__}: {str(exc)[:300]}",
                                 hint="`aiconfigurator cli support` lists what it models") from None
            table.setdefault(b, {})[k] = float(r.tpot) / 1e3
            db_version = getattr(r, "backend_version", db_version)
            if progress is not None:
                progress(f"aiconfigurator: batch {b}, steps {k}: {r.tpot:.3f} ms a step (estimate)")
    label = (f"aiconfigurator {version} static decode estimate of {model} on {system} ({backend} performance "
             f"database {db_version or 'latest'}, tp {tp_size}, {isl} prompt tokens): its MTP drafting (nextn = "
             "steps, none accepted) stands for the deployment's drafter; no step was measured")
    meta = {"source": "aiconfigurator", "estimate": label, "target": model, "device": system, "backend": backend,
            "backend_version": db_version, "aiconfigurator": version, "tp_size": tp_size, "prompt_tokens": isl,
            "threads": None, "clock": None, "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
    return CostModel(table, meta)
