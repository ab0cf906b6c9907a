#!/usr/bin/env bash
# Issue 13's speculative figures from nothing, in one command: record -> profile -> tune -> spec_bench.
#
#     bash benchmarks/spec_tuned.sh                     # O=a new temp dir, REPEATS=5, REQUESTS=6: ~15 min, 2 cores
#     O=out REPEATS=3 REQUESTS=4 bash benchmarks/spec_tuned.sh
#
# What it runs (benchmarks/spec_bench.py's docstring explains each step):
#  1. counterfactual verify traces (the drafter drafts TRACE_STEPS every step): one of every workload and
#     batch size (trace-all), and one of each workload alone (trace-code, trace-random, trace-mixed);
#  2. step costs on this machine (`specctl adaptive profile`, one torch thread and CPU-time clock as
#     spec_bench measures, greedy and sampled tables), at each workload's prompt length in tokens:
#     code 161, random 81, mixed and all 121;
#  3. `specctl adaptive tune` on trace-all (the one config for every workload: tune-all.json) and on each
#     workload's own trace (tune-code.json, ...);
#  4. spec_bench with `--tuned tune-all.json --tuned-for WORKLOAD=tune-WORKLOAD.json`, REPEATS interleaved
#     rounds: the table, and on its last line the JSON summary with every ratio the targets name.
# Everything lands in $O; spec.txt is the result. Run it on an otherwise idle machine.
set -euo pipefail
O=${O:-$(mktemp -d -t spec_tuned.XXXX)}
REPEATS=${REPEATS:-5}
REQUESTS=${REQUESTS:-6}
TRACE_STEPS=${TRACE_STEPS:-7}
PY=${PYTHON:-.venv/bin/python}
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 PYTHONUNBUFFERED=1
mkdir -p "$O"
rm -f "$O"/trace-*.jsonl  # spec_bench appends to a trace file: a rerun into the same $O starts afresh
say() { echo "[$(date +%H:%M:%S)] $*" >&2; }
specctl() { "$PY" -m specctl.cli "$@"; }

say "1/4 traces (drafting $TRACE_STEPS every step) -> $O/trace-*.jsonl"
"$PY" benchmarks/spec_bench.py --requests "$REQUESTS" --trace-steps "$TRACE_STEPS" --record-trace "$O/trace-all.jsonl"
for w in code random mixed; do
    "$PY" benchmarks/spec_bench.py --workloads "$w" --requests "$REQUESTS" --trace-steps "$TRACE_STEPS" \
        --record-trace "$O/trace-$w.jsonl"
done

say "2/4 step costs -> $O/cost-*.json"
for wp in all:121 code:161 random:81 mixed:121; do
    w=${wp%%:*}
    specctl adaptive profile -c tiny-colocated --threads 1 --clock cpu --sampled-temperature 1.0 \
        --prompt-tokens "${wp##*:}" --output "$O/cost-$w.json"
done

say "3/4 tune -> $O/tune-*.json"
for w in all code random mixed; do
    # trace-W.jsonl.json is the adaptive config the trace ran: the starting point tune improves on.
    specctl adaptive tune "$O/trace-$w.jsonl.json" --graph-batch-sizes 1,2,4,8 --trace "$O/trace-$w.jsonl" \
        --cost "$O/cost-$w.json" --format json > "$O/tune-$w.json"
done

say "4/4 spec_bench, $REPEATS interleaved rounds -> $O/spec.txt"
"$PY" benchmarks/spec_bench.py --tuned "$O/tune-all.json" --tuned-for code="$O/tune-code.json" \
    --tuned-for random="$O/tune-random.json" --tuned-for mixed="$O/tune-mixed.json" \
    --repeats "$REPEATS" --requests "$REQUESTS" | tee "$O/spec.txt"
say "done: $O"
