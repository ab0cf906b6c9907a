"""Step-cost profiling: the time of one decode step (draft + verify) per (batch size, steps).

`profile_costs(config, batch_sizes, steps)` builds one Engine for the deployment's decoding role, with its
runtime sized for the largest step, and for each batch size keeps that many requests decoding (greedy, or
sampled at `temperature`: rejection sampling costs more than greedy verify; with `sampled_temperature` a
second table is measured for sampled requests, in the same rounds, which `tune` mixes per verify batch by
the share of requests that sample — traces record it) while it pins the decoder to each step in turn
(`SpeculativeDecoder.pin_steps`; steps 0 is the plain path). Each (batch size, steps) point is timed over
`iters` engine steps JOINS times in each of `rounds` rounds; a round measures every batch size and, within
it, every step, so load drift on a shared machine hits every point alike; a point's cost is the median
over all its timed steps. Neither this order nor more rounds narrows the run-to-run spread on a noisy shared
machine (`benchmarks/tune_confirm.py` reads medians of repeated chains for that). Six rounds by default: with
three, a slow phase could price a step above a deeper one and change `tune`'s choice (benchmarks/RESULTS.md).
Each point starts from that many fresh requests (prefilled, then SETTLE untimed steps;
`prompt_tokens` long: a step costs more at longer contexts), long enough not to finish within it, so every
step runs the full batch.

After each `iters` timed steps one request leaves and a fresh one joins (a closed loop's turnover), and
the REFILL_STEPS steps after its prefill are timed: what they take beyond as many of the settled steps
before it is the point's refill, which `tune` adds at every replayed step that follows requests
joining. The steps right after a prefill run slower than settled ones (benchmarks/RESULTS.md): a prefill
pushes the decode's working set out of the core's cache, and speculation pays that more often: its
requests finish at different times, so they join one by one (many more prefills in a batch-8 run of
spec_bench than for plain decoding, whose equal-length requests finish together),
and a new request's first speculative step also runs the draft model over its prompt. A profile that
timed only the early steps priced plain decoding 6-12% above such runs and a deep step at what they
paid on average, which flipped `tune`'s choice on random text at batch 8. With `refill=False` the
turnovers are skipped and the model has no refill: `adaptive profile` passes it for a PD decode role,
which prefills nothing itself (served tiny-pd, 4 clients: a refill priced at every join put tune's
predicted speed-up at 0.87x and 0.86x what `bench --ab` measured, 0.94x and 0.92x without it).

`clock="cpu"` times with this process's CPU time instead of wall time: on a shared machine other jobs
barely disturb it, and with one torch thread on a CPU device it equals wall time on an idle machine.
The result is a `specctl.adaptive.tune.CostModel`.
"""

from __future__ import annotations

import dataclasses
import statistics
import time
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

from specctl.adaptive.served_cost import PROFILE_PROMPT
from specctl.adaptive.tune import CostModel
from specctl.engine.config import EngineConfig
from specctl.errors import UsageError

if TYPE_CHECKING:
    from specctl.engine.engine import Engine

SETTLE = 8  # untimed steps after a point's prefill before its steps are timed
REFILL_STEPS = 6  # steps timed after a joining request's prefill (later ones ran within 3% of settled ones)
JOINS = 2  # turnovers per point and round, each after `iters` settled steps
# Code-like text so a draft model agrees with the target about as often as it does on real prompts; the served
# profile (`adaptive profile --url`) sends windows of the same text.
_PROMPT = PROFILE_PROMPT


def _threads() -> int:
    import torch

    return int(torch.get_num_threads())


def profile_costs(
    config: EngineConfig,
    batch_sizes: Sequence[int],
    steps: Sequence[int],
    *,
    rounds: int = 6,
    iters: int = 6,
    temperature: float = 0.0,
    sampled_temperature: float | None = None,
    clock: str = "wall",
    prompt_tokens: int | None = None,
    refill: bool = True,
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
    if prompt_tokens is not None and prompt_tokens < 1:
        raise UsageError(f"--prompt-tokens {prompt_tokens}: expected at least 1")
    now = time.perf_counter if clock == "wall" else time.process_time
    kmax = max(steps)
    engine = Engine(dataclasses.replace(config, trace_out=None, trace_steps=max(kmax, 1)))
    prompts = _prompts(engine, prompt_tokens, max(batch_sizes) + 1)
    temperatures = [temperature] if sampled_temperature is None else [temperature, sampled_temperature]
    measured = _measure(engine, prompts, batch_sizes, steps, rounds, iters, temperatures, now, progress, refill)
    table, joins = measured[0]
    sampled, sampled_joins = measured[1] if sampled_temperature is not None else (None, None)
    meta = {
        "deployment": config.name,
        "target": config.model_ref,
        "algorithm": config.algorithm,
        "draft": config.speculative.draft,
        "device": str(engine.runner.device),
        "threads": _threads(),
        "rounds": rounds,
        "temperature": temperature,
        **({"sampled_temperature": sampled_temperature} if sampled_temperature is not None else {}),
        "iters": iters,
        "prompt_tokens": len(prompts[0]),
        "settle_steps": SETTLE,
        **({"refill_steps": REFILL_STEPS} if refill else {}),
        "clock": clock,
        "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }
    if not refill:
        return CostModel(table, meta, sampled)
    return CostModel(table, meta, sampled, joins, sampled_joins)


def _prompts(engine: Engine, tokens: int | None, count: int) -> list[list[int]]:
    """`count` different prompts for the profiled requests: windows of _PROMPT repeated, each starting a few
    characters further in, `tokens` ids long (default: _PROMPT's own length). Different prompts (and, when
    sampling, different seeds) make the requests of a step disagree as a real batch's do: each accepts
    its own number of drafts, so verify rolls back and the draft catches up by different amounts per
    request, where identical requests ran in lockstep (a batch-8 steps-2 point on sampled requests 3.2 ms,
    against 3.3-3.6 in spec_bench's settled steps). A step's cost also grows with its requests' context
    (attention over it; at batch 8, steps 5 of builtin:tiny-hybrid went 3.40 -> 3.54 -> 3.78 ms for
    prompts of 89, 178 and 267 tokens), so profile at the workload's prompt length."""
    base = engine.encode_prompt(_PROMPT)
    want = tokens if tokens is not None else len(base)
    text = _PROMPT * (2 + want // max(1, len(_PROMPT)))
    out = []
    for i in range(count):
        ids: list[int] = engine.encode_prompt(text[(5 * i) % len(_PROMPT):])
        out.append(ids[:want])
    return out


def _measure(
    engine: Engine,
    prompts: Sequence[list[int]],
    batch_sizes: Sequence[int],
    steps: Sequence[int],
    rounds: int,
    iters: int,
    temperatures: Sequence[float],
    now: Callable[[], float],
    progress: Callable[[str], None] | None,
    turnover: bool = True,
) -> list[tuple[dict[int, dict[int, float]], dict[int, dict[int, float]]]]:
    """Per temperature, per (batch size, steps) with requests at that temperature: the median seconds of one
    settled engine step, and the refill: the median over joins of the time of the REFILL_STEPS steps after a
    request joins, less as many of the settled steps timed just before it (0 where noise puts it below);
    without `turnover`, settled steps only (the refill table empty).

    Every round measures every temperature's table (which goes first alternates), so a slow phase hits the
    greedy and the sampled prices alike. Measured one table after the other, a slow phase priced a sampled
    plain step below a greedy one, though a sampled step does more (it draws), and `tune` weighed sampled traces
    at flatter prices (benchmarks/RESULTS.md)."""
    from specctl.engine.sampling_params import SamplingParams
    from specctl.engine.speculative.decoder import SpeculativeDecoder

    decoder = engine.decoder
    assert isinstance(decoder, SpeculativeDecoder)  # profile_costs refused a deployment that does not speculate
    kmax = max(steps)
    # Each point starts from fresh requests, so every point is timed over the same context lengths. Requests
    # that kept decoding across the whole table grew by ~170 tokens a round (at steps up to 7), and the
    # points later in a round (the deeper steps) ran at longer contexts than the earlier ones: at batch 8 the
    # table priced a plain step 25-40% above what the same engine's plain steps took in spec_bench's runs,
    # and a steps-3 step at 2.2x a plain one where those runs measured 2.7-2.9x.
    # Sampled requests verify by rejection sampling (a different, costlier path than greedy's argmax test).
    longest = (SETTLE + JOINS * (iters + REFILL_STEPS + 1) + 4) * (kmax + 1) + 8

    def request(i: int, temperature: float) -> int:
        """Add the point's i-th request: its own prompt and, sampling, its own seed."""
        params = SamplingParams(max_tokens=longest, ignore_eos=True, temperature=temperature,
                                seed=i if temperature > 0 else None)
        return int(engine.add_request(prompts[i % len(prompts)], params))

    samples: list[dict[int, dict[int, list[float]]]] = [{b: {k: [] for k in steps} for b in batch_sizes}
                                                         for _ in temperatures]
    joins: list[dict[int, dict[int, list[float]]]] = [{b: {k: [] for k in steps} for b in batch_sizes}
                                                      for _ in temperatures]
    rids: list[int] = []

    def drain() -> None:
        for r in rids:
            engine.abort(r)
        rids.clear()
        while engine.has_unfinished():
            engine.step()

    def until_decoding() -> None:
        """Step until every request is prefilled and has its first token."""
        while any(len(engine._seqs[r].output_ids) == 0 for r in rids):
            engine.step()

    def point(b: int, k: int, temperature: float, samples: list[float], joins: list[float]) -> None:
        """One round's timings of (b, k) at `temperature`: JOINS x `iters` settled steps, and a refill each."""
        decoder.pin_steps(k)
        drain()
        rids.extend(request(i, temperature) for i in range(b))
        until_decoding()
        for _ in range(SETTLE):
            engine.step()
        for j in range(JOINS):
            settled = []
            for _ in range(iters):
                t0 = now()
                engine.step()
                settled.append(now() - t0)
            samples.extend(settled)
            if not turnover:
                continue
            # a closed loop's turnover: one request leaves, a fresh one takes its place
            engine.abort(rids.pop(0))
            rids.append(request(b + j, temperature))
            until_decoding()  # its prefill (beside the others' decode step): not a decode step's cost
            t0 = now()
            for _ in range(REFILL_STEPS):
                engine.step()
            # against the settled steps just before it: the requests' contexts grow over a point
            joins.append(now() - t0 - REFILL_STEPS * statistics.median(settled))

    order = list(range(len(temperatures)))
    for r in range(rounds):
        for t in order if r % 2 == 0 else order[::-1]:
            for b in batch_sizes:
                for k in steps:
                    point(b, k, temperatures[t], samples[t][b][k], joins[t][b][k])
        drain()
        if progress is not None and r + 1 < rounds:
            progress(f"round {r + 1} of {rounds} measured")
    out = []
    for t, temperature in enumerate(temperatures):
        table = {b: {k: statistics.median(v) for k, v in row.items()} for b, row in samples[t].items()}
        refill = {b: {k: max(0.0, statistics.median(v)) for k, v in row.items() if v} for b, row in joins[t].items()}
        if progress is not None:
            if t > 0:
                progress(f"sampled requests (temperature {temperature}):")
            for b in batch_sizes:
                progress(f"batch {b}: " + ", ".join(f"{k}: {table[b][k] * 1e3:.2f} ms" for k in steps))
            if turnover:
                for b in batch_sizes:
                    progress(f"batch {b}, after a request joins: "
                             + ", ".join(f"{k}: {refill[b][k] * 1e3:.2f} ms" for k in steps))
        out.append((table, refill))
    return out
