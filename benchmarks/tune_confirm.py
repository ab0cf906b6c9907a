"""Does `specctl adaptive tune`'s prediction hold? trace -> profile -> tune -> `bench --ab`, per workload.

For each workload (bench's `code` and `random` datasets by default) on a launched deployment (tiny-pd):

1. `specctl bench -c DEPLOY --trace-out T --trace-steps K` records a counterfactual verify trace;
2. `specctl adaptive profile -c DEPLOY --threads N` measures the step costs once (N = the threads the
   launcher gives the decoding process: cpu_count / engine processes);
3. `specctl adaptive tune DEPLOY --trace T --cost C --format json` recommends a config and predicts its
   speed-up over no speculation;
4. the recommendation is written into a copy of the deployment, and `specctl bench -c COPY --ab
   speculative.algorithm=none` measures the same ratio (interleaved rounds, bootstrap CI).

Every `--ab` round is the load the trace recorded: `--num-prompts` requests from `--concurrency` clients
(the comparison sends --num-prompts x --rounds in all). A round starts with the clients' first prompts
and nothing to decode, and ends with its last requests decoding at a falling batch size; the trace's
run has that ramp once, so rounds of another size measure another workload. Rounds of an eighth of the
traced run (64 prompts, 8 rounds) measured code at 1.35x where the same config measured 1.7x in runs
of the traced size, and the prediction, which prices the traced run, missed by up to 14%.

The target: predicted within 10% of measured on two workloads, read as medians of `--repeats` whole
chains (profile, then each workload's trace, tune and `--ab`; 5 by default, ~3 min each on 2 cores). One chain
is not enough on a shared machine: four single chains at one commit gave pred/meas 0.92, 1.16, 1.13 and 1.01
on code and 1.01, 0.94, 1.06, 0.81 on random. Both sides scatter: the same `--ab` measured random at 1.62x
to 1.95x across chains, and in one process the same profiled point's median over 12 steps varied up to 2x
between windows of ~100 ms (CPU clock, 2-core VM), so a profile's ratios move by ~10% from run to run.
Both scatter most through the profile's phase: in 5 chains on 2026-12-04 the two profiles taken in a slow phase
priced the plain step 1.7x the others' while steps 7 rose 10-35%, and predicted 1.16-1.44 of measured; the
other three 0.79-0.98 (benchmarks/RESULTS.md). So each row also carries that profile's plain step per batch size
and its deepest step over it, and the absolute tokens/s on both sides (the prediction is the decode server's
rate, the measurement the clients'). Prints each chain's line, a table of medians, then a last-line JSON
summary (each chain's recommendation).

Ports: --port-base (default 24100) and up, on 127.0.0.1: below the kernel's ephemeral range (32768-60999 on
Linux), where a port polled before its server binds it can be taken by the poll itself (a TCP self-connect).

    python benchmarks/tune_confirm.py [--deploy tiny-pd] [--workloads code,random] [--num-prompts 64]
                                      [--concurrency 4] [--output-len 64] [--input-len 128] [--rounds 5]
                                      [--repeats 5]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import yaml


def cli(*args: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    out = subprocess.run([sys.executable, "-m", "specctl.cli", *args], capture_output=True, text=True, env=env,
                         timeout=1800)
    if out.returncode != 0:
        sys.stderr.write(out.stdout[-3000:] + out.stderr[-3000:])
        raise SystemExit(f"specctl {' '.join(args[:3])} failed with exit {out.returncode}")
    return out


def deployment_with(deploy: str, rec: dict[str, Any], path: Path, env: dict[str, str]) -> Path:
    """A copy of the deployment whose speculative block runs the tune recommendation."""
    shown = cli("presets", "show", deploy, env=env).stdout if not Path(deploy).exists() else Path(deploy).read_text()
    doc = yaml.safe_load(shown)
    # deployment_adaptive also carries specctl-only knobs (zero_backoff, zero_threshold), which the SGLang JSON cannot
    cfg = rec["deployment_adaptive"]["buckets"] if rec.get("deployment_adaptive") else rec["sglang_adaptive_config"]
    buckets = {int(k): v for k, v in cfg.items() if k.isdigit()}
    spec = doc.setdefault("speculative", {})
    spec["num_steps"] = rec["initial_steps"]
    spec["adaptive"] = {"strategy": "ema", "buckets": buckets}
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    return path


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--deploy", default="tiny-pd")
    ap.add_argument("--workloads", default="code,random")
    ap.add_argument("--num-prompts", type=int, default=64, help="requests of the traced run and of every round")
    ap.add_argument("--concurrency", type=int, default=4)
    ap.add_argument("--output-len", type=int, default=64)
    ap.add_argument("--input-len", type=int, default=128,
                    help="prompt tokens (the profile's too): a speculating decode server runs its draft over each")
    ap.add_argument("--rounds", type=int, default=5, help="--ab rounds of each measurement")
    ap.add_argument("--repeats", type=int, default=5,
                    help="whole profile -> trace -> tune -> --ab chains; the verdict reads their medians")
    ap.add_argument("--trace-steps", type=int, default=7)
    ap.add_argument("--threads", type=int, default=max(1, (os.cpu_count() or 1) // 2))
    ap.add_argument("--port-base", type=int, default=24100)
    ap.add_argument("--histogram", action="store_true",
                    help="also tune on the trace's histogram form (`adaptive trace --from-trace`: what SGLang reports "
                         "per request), compare its predictions with the exact trace's (whole, and decode only), "
                         "and confirm the histogram-tuned config with --ab")
    ap.add_argument("--clock", choices=("cpu", "wall"), default="cpu",
                    help="the profile's clock (cpu: robust on a shared machine; equals wall on an idle one)")
    args = ap.parse_args()
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
    p = args.port_base
    ports = ["--set", f"roles.router.port={p}", "--set", f"roles.prefill.port={p + 1}", "--set",
             f"roles.decode.port={p + 2}", "--set", f"roles.prefill.bootstrap_port={p + 3}"]
    load = ["--max-concurrency", str(args.concurrency),
            "--random-output-len", str(args.output_len), "--random-input-len", str(args.input_len), "--no-progress"]
    tmp = Path(tempfile.mkdtemp(prefix="tune_confirm_"))
    rows: list[dict[str, Any]] = []
    for rep in range(args.repeats):
        cost = tmp / f"cost{rep}.json"
        # profiled at the workload's prompt length (its bytes and the BOS): a step costs more at longer contexts
        cli("adaptive", "profile", "-c", args.deploy, "--threads", str(args.threads), "--clock", args.clock,
            "--prompt-tokens", str(args.input_len + 1),
            "--batch-sizes", ",".join(str(b) for b in (1, 2, 4, 8) if b <= max(8, args.concurrency)), "-o", str(cost),
            env=env)
        # the profile's phase, in two figures per batch size: its plain step and its deepest step over it (a slow
        # phase of a shared machine does not slow them alike: benchmarks/RESULTS.md, 2026-12-04)
        table = json.loads(cost.read_text())["step_s"]
        phase = {"profile_plain_ms": {b: round(row["0"] * 1e3, 3) for b, row in table.items()},
                 "profile_deepest_over_plain": {b: round(row[max(row, key=int)] / row["0"], 3)
                                                for b, row in table.items()}}
        for kind in args.workloads.split(","):
            rows.append(confirm(args, kind, cost, tmp / f"{kind}{rep}", ports, load, env) | {"repeat": rep, **phase})
            r = rows[-1]
            print(f"repeat {rep + 1}/{args.repeats} {kind:8s} predicted {r['predicted_vs_none']:.2f}x none, measured "
                  f"{r['measured_vs_none']:.2f}x [{r['measured_ci95'][0]}, {r['measured_ci95'][1]}]  "
                  f"pred/meas {r['predicted_over_measured']:.2f}"
                  + (f"  histogram/exact {r['histogram_over_exact']:.3f} (decode only "
                     f"{r['decode_only_histogram_over_exact']:.3f})" if "histogram_over_exact" in r else ""),
                  file=sys.stderr)
    summary = [summarise(kind, [r for r in rows if r["workload"] == kind]) for kind in args.workloads.split(",")]
    print(f"{'workload':8s} {'predicted':>9s} {'measured':>9s} {'pred/meas':>9s} {'range':>13s}  (medians of "
          f"{args.repeats} repeats)")
    for row in summary:
        lo, hi = row["predicted_over_measured_range"]
        print(f"{row['workload']:8s} {row['predicted_vs_none']:9.2f} {row['measured_vs_none']:9.2f} "
              f"{row['predicted_over_measured']:9.2f} {f'{lo:.2f}-{hi:.2f}':>13s}")
    print(json.dumps({"bench": "tune_confirm", "deploy": args.deploy, "threads": args.threads, "repeats": args.repeats,
                      "summary": summary, "rows": rows, "all_within_10pct": all(s["within_10pct"] for s in summary)}))


def confirm(args: argparse.Namespace, kind: str, cost: Path, stem: Path, ports: list[str], load: list[str],
            env: dict[str, str]) -> dict[str, Any]:
    """One workload once: trace it, tune on the trace and `cost`, and measure the recommendation with `--ab`."""
    trace = stem.with_suffix(".trace.jsonl")
    hist = stem.with_suffix(".hist.jsonl")  # the same run as SGLang reports it: one line per request
    cli("bench", "-c", args.deploy, *ports, "--dataset-name", kind, *load, "--num-prompts", str(args.num_prompts),
        "--trace-out", str(trace), "--trace-steps", str(args.trace_steps), "--seed", "11",
        *(["--request-trace-out", str(hist)] if args.histogram else []), env=env)
    tuned = json.loads(cli("adaptive", "tune", args.deploy, "--trace", str(trace), "--cost", str(cost),
                           "--format", "json", env=env).stdout)
    versus: dict[str, Any] = {}
    if args.histogram:

        # SGLang gives the histogram alone: drop the verifies' order specctl's servers add (`accepted`)
        lines = [json.loads(x) for x in hist.read_text().splitlines() if x.strip()]
        hist.write_text("".join(json.dumps({k: v for k, v in x.items() if k != "accepted"}) + "\n" for x in lines))

        def tune_on(path: Path, *extra: str) -> dict[str, Any]:
            return dict(json.loads(cli("adaptive", "tune", args.deploy, "--trace", str(path), "--cost", str(cost),
                                       *extra, "--format", "json", env=env).stdout))

        exact_decode, hist_decode = tune_on(trace, "--decode-only"), tune_on(hist, "--decode-only")
        exact = tuned
        tuned = tune_on(hist)  # confirmed below: the histogram-tuned config, its serving time from request TTFTs
        versus = {"exact_vs_none": round(exact["speedup"]["vs_none"], 4),
                  "histogram_vs_none": round(tuned["speedup"]["vs_none"], 4),
                  "histogram_over_exact": round(tuned["speedup"]["vs_none"] / exact["speedup"]["vs_none"], 4),
                  "decode_only_histogram_over_exact": round(
                      hist_decode["speedup"]["vs_none"] / exact_decode["speedup"]["vs_none"], 4),
                  "exact_recommended": exact["recommended"].get("deployment_adaptive"),
                  "exact_best_fixed": exact["best_fixed"]["steps"],
                  "histogram_best_fixed": tuned["best_fixed"]["steps"]}
    copy = deployment_with(args.deploy, tuned["recommended"], stem.with_suffix(".deploy.yaml"), env)
    lines = cli("bench", "-c", str(copy), *ports, "--dataset-name", kind, *load, "--num-prompts",
                str(args.num_prompts * args.rounds), "--ab", "speculative.algorithm=none", "--ab-rounds",
                str(args.rounds), "--format", "json", env=env).stdout.splitlines()
    # bench --format json writes JSON Lines: one record per variant, then the comparison
    records = [json.loads(line) for line in lines if line.strip()]
    comparison = next(r.get("comparison", r) for r in records
                      if r.get("kind") == "ab-comparison" or "comparison" in r)
    none_row = comparison["variants"][1]["output_throughput_ratio"]
    measured = 1.0 / none_row["ratio"]
    lo, hi = none_row["ci95"]
    ci = [1.0 / hi if isinstance(hi, (int, float)) else None, 1.0 / lo if isinstance(lo, (int, float)) else None]
    predicted = tuned["speedup"]["vs_none"]
    # absolute rates, to tell which side of a missed ratio missed: the prediction is the decode server's tokens/s
    # (at served speed), the measurement the clients' output tokens/s (TTFT and the prefill role included)
    base_row, none_full = comparison["variants"][0], comparison["variants"][1]
    rates = {"predicted_tokens_per_s": {"recommended": round(tuned["predicted"]["tokens_per_s"], 1),
                                        "none": round(tuned["none"]["tokens_per_s"], 1)},
             "measured_tokens_per_s": {"recommended": round(base_row["output_throughput"], 1),
                                       "none": round(none_full["output_throughput"], 1)},
             "serving_overhead": tuned.get("serving_overhead")}
    return {"workload": kind, "predicted_vs_none": round(predicted, 3), "measured_vs_none": round(measured, 3),
            "measured_ci95": [round(x, 3) if x else None for x in ci],
            "predicted_over_measured": round(predicted / measured, 3),
            "within_10pct": abs(predicted / measured - 1) <= 0.10,
            "recommended": tuned["recommended"].get("deployment_adaptive")
            or tuned["recommended"]["sglang_adaptive_config"],
            "initial_steps": tuned["recommended"]["initial_steps"],
            "predicted_vs_best_fixed": round(tuned["speedup"]["vs_best_fixed"], 3),
            "predicted_vs_current": round(tuned["speedup"]["vs_current"], 3), **rates, **versus}


def summarise(kind: str, rows: list[dict[str, Any]]) -> dict[str, Any]:
    """A workload's repeats: the medians of predicted, measured and their ratio (the target reads the
    last: within 10%), and the ratio's range."""
    ratios = [r["predicted_over_measured"] for r in rows]
    ratio = statistics.median(ratios)
    return {"workload": kind, "repeats": len(rows),
            "predicted_vs_none": round(statistics.median(r["predicted_vs_none"] for r in rows), 3),
            "measured_vs_none": round(statistics.median(r["measured_vs_none"] for r in rows), 3),
            "predicted_over_measured": round(ratio, 3),
            "predicted_over_measured_range": [min(ratios), max(ratios)],
            "within_10pct": abs(ratio - 1) <= 0.10,
            "repeats_within_10pct": sum(1 for r in rows if r["within_10pct"])}

if __name__ == "__main__":
    main()
