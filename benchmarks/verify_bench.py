"""Verify cost: a target forward over k positions vs a 1-position decode step, side by side in one run.

What it measures (an engine where speculation pays): the wall time of `ModelRunner.forward`
over k new positions per request (k = 1 is a plain decode step; k = steps + 1 is a speculative verify)
at the end of a `--context`-token cached prompt, then rolled back with `truncate` so every timing starts
from the same cache. Positions are interleaved within each repeat (drift hits all alike); the figure per
k is the median over `--repeats` x `--iters`; ratios are to k = 1 at the same batch size.

Target: verify of 4 positions <= 1.3x a 1-position step at batch 1 (builtin:tiny-hybrid, whose mamba
layer keeps per-position states for rollback). Prints a table, then a last-line JSON summary.

    python benchmarks/verify_bench.py [--model builtin:tiny-hybrid] [--batch-sizes 1,8] [--positions 1,2,3,4,5,8]
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import torch

from specctl.engine.model_runner import ForwardItem, ModelRunner


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="builtin:tiny-hybrid")
    ap.add_argument("--batch-sizes", default="1,8")
    ap.add_argument("--positions", default="1,2,3,4,5,8")
    ap.add_argument("--context", type=int, default=200)
    ap.add_argument("--repeats", type=int, default=7)
    ap.add_argument("--iters", type=int, default=40)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--device", default="cpu")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    sizes = [int(b) for b in args.batch_sizes.split(",")]
    positions = sorted({1, *(int(k) for k in args.positions.split(","))})
    runner = ModelRunner(args.model, device=args.device, max_requests=max(sizes), max_draft_tokens=max(positions) - 1,
                         max_tokens=max(sizes) * (args.context + max(positions) + 16))
    prompt = [(7 * i) % 200 + 40 for i in range(args.context)]
    for rid in range(max(sizes)):
        runner.allocate(rid, args.context + max(positions))
        runner.forward([ForwardItem(rid, prompt, 0)])
    samples: dict[tuple[int, int], list[float]] = {(b, k): [] for b in sizes for k in positions}
    for _ in range(args.repeats):
        for b in sizes:
            for k in positions:
                items = [ForwardItem(rid, [5] * k, args.context) for rid in range(b)]
                runner.forward(items)  # warm this shape
                for rid in range(b):
                    runner.truncate(rid, args.context)
                for _ in range(args.iters):
                    t0 = time.perf_counter()
                    runner.forward(items)
                    if runner.device.type == "cuda":
                        torch.cuda.synchronize()
                    samples[(b, k)].append(time.perf_counter() - t0)
                    for rid in range(b):
                        runner.truncate(rid, args.context)
    med = {key: statistics.median(v) for key, v in samples.items()}
    print(f"{'batch':>5s} {'positions':>9s} {'ms':>8s} {'vs 1 position':>14s}")
    ratios: dict[str, float] = {}
    for b in sizes:
        for k in positions:
            r = med[(b, k)] / med[(b, 1)]
            ratios[f"b{b}_p{k}"] = round(r, 3)
            print(f"{b:5d} {k:9d} {med[(b, k)] * 1e3:8.3f} {r:14.2f}")
    target = ratios.get("b1_p4")
    print(json.dumps({"bench": "verify", "model": args.model, "threads": args.threads, "context": args.context,
                      "ms": {f"b{b}_p{k}": round(v * 1e3, 4) for (b, k), v in med.items()}, "ratios": ratios,
                      "checks": {"b1_4_positions_le_1.3x_1_position": None if target is None else target <= 1.3}}))


if __name__ == "__main__":
    main()
