"""Step-cost profiling: the time of one decode step (draft + verify) per (batch size, steps).

`profile_costs(config, batch_sizes, steps)` builds one Engine for the deployment's decoding role, with
its runtime sized for the largest step, and for each batch size keeps that many requests decoding
(greedy, or sampled at `temperature`: rejection sampling costs more than greedy verify; with
`sampled_temperature` a second table is measured for sampled requests, which `tune` mixes per verify
batch by the share of requests that sample — traces record it) while it pins the decoder to each step in turn
(`SpeculativeDecoder.pin_steps`; steps 0 is the plain path). Each (batch size, steps) point is timed
over `iters` engine steps in each of `rounds` rounds, the steps interleaved within a round so load
drift on a shared machine hits every point alike;
a point's cost is the median over all its timed steps. Each point starts from that many fresh requests
(prefilled, then one untimed step), long enough not to finish within it, so every step runs the full batch
and every point sees the same context lengths. `clock="cpu"` times with this process's CPU time
instead of wall time: on a shared machine other jobs barely disturb it, and with one torch thread on a
CPU device it equals wall time on an idle machine. The result is a `specctl.engine.spec.tune.CostModel`.
"""

from __future__ import annotations

import dataclasses
import statistics
import time
from collections.abc import Callable, Sequence
from typing import Any

from specctl.engine.config import EngineConfig
from specctl.engine.spec.tune import CostModel
from specctl.errors import UsageError

# Code-like text so a draft model agrees with the target about as often as it does on real prompts.
_PROMPT = "import os\nimport sys\n\n\ndef main(argv):\n    for name in argv:\n        path = os.path.join("


def _threads() -> int:
    import torch

    return int(torch.get_num_threads())


def profile_costs(
    config: EngineConfig,
    batch_sizes: Sequence[int],
    steps: Sequence[int],
    *,
    rounds: int = 3,
    iters: int = 6,
    temperature: float = 0.0,
    sampled_temperature: float | None = None,
    clock: str = "wall",
    progress: Callable[[str], None] | None = None,
) -> CostModel:
    from specctl.engine.engine import Engine

    if config.algorithm == "none":
        raise UsageError("the deployment does not speculate (speculative.algorithm: none): nothing to profile",
                         hint="profile the speculative deployment; steps 0 is measured as its plain decode")
    too_big = [b for b in batch_sizes if b > config.max_batch_size]
    if too_big:
        raise UsageError(f"--batch-sizes {too_big} exceed serve.max_batch_size {config.max_batch_size}",
                         hint="pick batch sizes the deployment can run")
    if clock not in ("wall", "cpu"):
        raise UsageError(f"clock {clock!r}: expected wall or cpu")
    now = time.perf_counter if clock == "wall" else time.process_time
    kmax = max(steps)
    engine = Engine(dataclasses.replace(config, trace_out=None, trace_steps=max(kmax, 1)))
    table = _measure(engine, batch_sizes, steps, rounds, iters, temperature, now, progress)
    sampled = None
    if sampled_temperature is not None:
        if progress is not None:
            progress(f"sampled requests (temperature {sampled_temperature}):")
        sampled = _measure(engine, batch_sizes, steps, rounds, iters, sampled_temperature, now, progress)
    meta = {
        "deployment": config.name,
        "target": config.model_ref,
        "algorithm": config.algorithm,
        "draft": config.speculative.get("draft"),
        "device": str(engine.runner.device),
        "threads": _threads(),
        "rounds": rounds,
        "temperature": temperature,
        **({"sampled_temperature": sampled_temperature} if sampled_temperature is not None else {}),
        "iters": iters,
        "clock": clock,
        "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }
    return CostModel(table, meta, sampled)


def _measure(
    engine: Any,
    batch_sizes: Sequence[int],
    steps: Sequence[int],
    rounds: int,
    iters: int,
    temperature: float,
    now: Callable[[], float],
    progress: Callable[[str], None] | None,
) -> dict[int, dict[int, float]]:
    """Median seconds of one engine step per (batch size, steps) with requests at `temperature`."""
    from specctl.engine.sampling import SamplingParams

    decoder: Any = engine.decoder
    kmax = max(steps)
    # Each point starts from fresh requests, so every point is timed over the same context lengths. Requests
    # that kept decoding across the whole table grew by ~170 tokens a round (at steps up to 7), and the
    # points later in a round (the deeper steps) ran at longer contexts than the earlier ones: at batch 8 the
    # table priced a plain step 25-40% above what the same engine's plain steps took in spec_bench's runs,
    # and a steps-3 step at 2.2x a plain one where those runs measured 2.7-2.9x.
    # Sampled requests verify by rejection sampling (a different, costlier path than greedy's argmax test).
    params = SamplingParams(max_tokens=(iters + 2) * (kmax + 1) + 8, ignore_eos=True,
                            temperature=temperature, seed=0 if temperature > 0 else None)
    samples: dict[int, dict[int, list[float]]] = {b: {k: [] for k in steps} for b in batch_sizes}
    rids: list[int] = []

    def drain() -> None:
        for r in rids:
            engine.abort(r)
        rids.clear()
        while engine.has_unfinished():
            engine.step()

    for b in batch_sizes:
        for _ in range(rounds):
            for k in steps:
                decoder.pin_steps(k)
                drain()
                rids.extend(engine.add_request(_PROMPT, params) for _ in range(b))
                # step until every request is decoding (prefilled, first token out)
                while any(len(engine._seqs[r].output_ids) == 0 for r in rids):
                    engine.step()
                engine.step()  # warm this step's path
                for _ in range(iters):
                    t0 = now()
                    engine.step()
                    samples[b][k].append(now() - t0)
        drain()
        if progress is not None:
            row = ", ".join(f"{k}: {statistics.median(samples[b][k]) * 1e3:.2f} ms" for k in steps)
            progress(f"batch {b}: {row}")
    return {b: {k: statistics.median(v) for k, v in row.items()} for b, row in samples.items()}
