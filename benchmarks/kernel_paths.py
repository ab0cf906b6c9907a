"""Do the kernel's whole-layer and whole-chain paths pay for themselves? Three paths side by side in one run.

What it measures: the wall time of the same engine call on three paths of `engine/ops.py`, in one process:

- `fused`: the default (the whole-layer `full_layers` and whole-chain `lone_chains` calls where they apply);
- `per-op`: the small-row kernel operation by operation (`ops.paths(fused=False)`: the forward layer by
  layer, the draft chain a forward per token);
- `torch`: no kernel at all (`ops.paths(kernel=False)`).

Calls: a decode step (1 position) and a verify (`--verify-positions`) of each builtin model at each batch size,
at the end of a `--context`-token cached prompt and rolled back with `truncate`, so every timing starts from
the same cache; and builtin:tiny-draft's greedy draft chains (`ModelRunner.draft_chain`, `--chain-steps`
tokens a request). The whole-layer path applies to full-attention models only (tiny-draft), so tiny-hybrid's
rows show per-op against torch alone.

Noise: a shared machine drifts, so each repeat times every case on every path back to back (the paths'
order rotating between repeats), the figure per repeat is the median of `--iters` calls, and the ratios
(per-op / fused, torch / fused, torch / per-op) are formed within a repeat; the table gives their median
over `--repeats` with the min-max spread. `wins`: in how many repeats the fused call beat the per-op path; a
fused path pays for itself where per-op / fused has a median above 1 and it wins in most repeats (`pays`).
Prints a table, then a last-line JSON summary.

    python benchmarks/kernel_paths.py [--batch-sizes 1,8] [--repeats 7] [--iters 30]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time
from collections.abc import Callable
from contextlib import AbstractContextManager
from dataclasses import dataclass

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

import torch  # noqa: E402

from specctl.engine import ops  # noqa: E402
from specctl.engine.model_runner import ForwardItem, ModelRunner  # noqa: E402

PATHS = ("fused", "per-op", "torch")


def _on(path: str) -> AbstractContextManager[None]:
    """The engine on one of PATHS."""
    if path == "torch":
        return ops.paths(kernel=False)
    return ops.paths(fused=path == "fused")


@dataclass
class Case:
    name: str
    fused_applies: bool  # whether the whole-layer / whole-chain path can run here
    call: Callable[[], None]  # one timed call, leaving the cache as it found it


def _forward_case(runner: ModelRunner, model: str, batch: int, positions: int, context: int) -> Case:
    items = [ForwardItem(rid, [5] * positions, context) for rid in range(batch)]

    def call() -> None:
        runner.forward(items)
        for rid in range(batch):
            runner.truncate(rid, context)

    kind = "decode" if positions == 1 else f"verify{positions}"
    full = all(k == "full" for k in runner.config.layer_kinds)
    return Case(f"{model.split(':')[-1]} {kind} b{batch}", full, call)


def _chain_case(runner: ModelRunner, batch: int, steps: int, context: int) -> Case:
    rids = list(range(batch))

    def call() -> None:
        chains = runner.draft_chain(rids, [[5]] * batch, [steps] * batch)
        assert chains is not None, "the draft's lean path did not apply"
        for rid in rids:
            runner.truncate(rid, context)

    return Case(f"tiny-draft chain{steps} b{batch}", True, call)


def _runner(model: str, batch: int, context: int, extra: int) -> ModelRunner:
    runner = ModelRunner(model, max_requests=batch, max_draft_tokens=extra,
                         max_tokens=batch * (context + extra + 16))
    prompt = [(7 * i) % 200 + 40 for i in range(context)]
    for rid in range(batch):
        runner.allocate(rid, context + extra + 1)
        runner.forward([ForwardItem(rid, prompt, 0)])
    return runner


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--batch-sizes", default="1,8")
    ap.add_argument("--verify-positions", type=int, default=5, help="positions of a verify (steps + 1)")
    ap.add_argument("--chain-steps", type=int, default=4, help="draft tokens a request in a chain")
    ap.add_argument("--context", type=int, default=200)
    ap.add_argument("--repeats", type=int, default=7)
    ap.add_argument("--iters", type=int, default=30)
    ap.add_argument("--threads", type=int, default=1)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    if ops.kernel() is None:
        raise SystemExit("kernel_paths: no small-row kernel here (no C compiler, or SPECCTL_SMALL_GEMM=0)")
    sizes = [int(b) for b in args.batch_sizes.split(",")]
    extra = max(args.verify_positions, args.chain_steps) + 1
    cases: list[Case] = []
    for model in ("builtin:tiny-draft", "builtin:tiny-hybrid"):
        for b in sizes:
            runner = _runner(model, b, args.context, extra)
            cases += [_forward_case(runner, model, b, 1, args.context),
                      _forward_case(runner, model, b, args.verify_positions, args.context)]
            if model == "builtin:tiny-draft":
                cases.append(_chain_case(runner, b, args.chain_steps, args.context))
    per_repeat: dict[tuple[str, str], list[float]] = {(c.name, p): [] for c in cases for p in PATHS}
    for rep in range(args.repeats):
        order = PATHS[rep % 3:] + PATHS[:rep % 3]
        for case in cases:
            for path in order:
                with _on(path):
                    case.call()  # warm this shape on this path
                    times = []
                    for _ in range(args.iters):
                        t0 = time.perf_counter()
                        case.call()
                        times.append(time.perf_counter() - t0)
                per_repeat[(case.name, path)].append(statistics.median(times))
    summary: dict[str, dict[str, object]] = {}
    print(f"{'case':24s} {'fused us':>9s} {'per-op us':>9s} {'torch us':>9s}  {'per-op/fused':>18s}  "
          f"{'torch/fused':>18s}  {'torch/per-op':>18s}  wins  pays")
    for case in cases:
        t = {p: per_repeat[(case.name, p)] for p in PATHS}
        med = {p: statistics.median(v) * 1e6 for p, v in t.items()}

        def ratio(num: str, den: str, t: dict[str, list[float]] = t) -> tuple[float, float, float]:
            r = [a / b for a, b in zip(t[num], t[den], strict=True)]
            return statistics.median(r), min(r), max(r)

        rows = {"per-op/fused": ratio("per-op", "fused"), "torch/fused": ratio("torch", "fused"),
                "torch/per-op": ratio("torch", "per-op")}
        wins = sum(a > b for a, b in zip(t["per-op"], t["fused"], strict=True))
        pays = rows["per-op/fused"][0] > 1.0 and 2 * wins > args.repeats if case.fused_applies else None
        cells = "  ".join(f"{m:6.2f} [{lo:4.2f}-{hi:4.2f}]" for m, lo, hi in rows.values())
        print(f"{case.name:24s} {med['fused']:9.0f} {med['per-op']:9.0f} {med['torch']:9.0f}  {cells}  "
              f"{wins:2d}/{args.repeats:<2d} {'-' if pays is None else ('yes' if pays else 'NO')}")
        summary[case.name] = {"us": {p: round(v, 1) for p, v in med.items()},
                              "ratios": {k: [round(x, 3) for x in v] for k, v in rows.items()},
                              "fused_applies": case.fused_applies, "wins": wins, "pays": pays}
    print(json.dumps({"bench": "kernel_paths", "threads": args.threads, "context": args.context,
                      "repeats": args.repeats, "iters": args.iters, "isa": ops.kernel().isa,  # type: ignore[union-attr]
                      "cases": summary}))


if __name__ == "__main__":
    main()
