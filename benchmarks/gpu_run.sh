#!/usr/bin/env bash
# The one prepared GPU run: the builtin engine and the speculative benchmarks on CUDA, eager
# (no CUDA graphs are captured: the runtime states per step are the buffers a capture would bind to).
#
# Made for the `device` tool's H200 machine, where python3 already holds a CUDA torch, typer, rich,
# pyyaml, safetensors and tokenizers (see /work/.library/device/KINDS.md); the few packages
# specctl needs that the image lacks (msgspec, jsonschema, pyzmq) travel as wheels in .whl/ when present
# (`bash benchmarks/gpu_wheels.sh` fills it here; hand it over with carry=[".whl"]).
# Run it from the repository root, e.g. through `run` with timeout_s 480 and carry [".whl"]:
#
#     bash benchmarks/gpu_run.sh            # DEVICE=cuda, writes $OUT/*.txt (or ./gpu-out without $OUT)
#     DEVICE=cpu QUICK=1 bash benchmarks/gpu_run.sh   # the same script on this machine, to check it runs
#     (checked so with a bare CPython 3.12 venv holding only the image's packages and torch 2.13.0+cu130:
#     the wheels install and all three steps pass)
#
# Steps, each bounded by `timeout` so one hang cannot eat the device budget: a smoke test that greedy
# speculative output equals plain greedy on the device (the correctness oracle), verify_bench (k-position
# verify vs a 1-position step), spec_bench (none / fixed steps / adaptive, code and random, batch 1 and 8,
# wall clock: CPU time means nothing on a GPU), engine_bench's builtin-hybrid throughput at 1, 8, 32.
set -u -o pipefail
DEVICE=${DEVICE:-cuda}
QUICK=${QUICK:-0}
PY=${PYTHON:-python3}
OUT_DIR=${OUT:-$PWD/gpu-out}
mkdir -p "$OUT_DIR"
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 PYTHONUNBUFFERED=1
if [ -d .whl ]; then "$PY" -m pip install -q --no-deps --no-index .whl/*.whl 2>&1 | tail -2; fi
# The repository root is the package `specctl`: put a link to it on the path.
PP=$(mktemp -d)
ln -s "$PWD" "$PP/specctl"
export PYTHONPATH="$PP${PYTHONPATH:+:$PYTHONPATH}"
"$PY" - <<EOF 2>&1 | tee "$OUT_DIR/env.txt"
import torch
print("torch", torch.__version__, "cuda available", torch.cuda.is_available(),
      torch.cuda.get_device_name(0) if torch.cuda.is_available() else "")
EOF

step() {  # step NAME SECONDS CMD...: run one step, keep its output, never stop the script
    local name=$1 secs=$2; shift 2
    echo "== $name" | tee -a "$OUT_DIR/summary.txt"
    timeout "$secs" "$@" > "$OUT_DIR/$name.txt" 2>&1
    local rc=$?
    tail -n 1 "$OUT_DIR/$name.txt" | cut -c1-2000 >> "$OUT_DIR/summary.txt"
    echo "   exit $rc" | tee -a "$OUT_DIR/summary.txt"
}

step smoke 120 "$PY" - <<EOF
import torch
from specctl.engine.config import EngineConfig
from specctl.engine.engine import Engine
from specctl.engine.sampling import SamplingParams
base = dict(model_ref="builtin:tiny-hybrid", dtype="float32", device="$DEVICE", page_size=16, max_tokens=8192,
            max_batch_size=8, graph_batch_sizes=(1, 2, 4, 8))
prompts = ["def fibonacci(n):\n    ", "import os\n\ndef main(argv):\n", "class Stack:\n    def push(self, x):"]
params = SamplingParams(max_tokens=64, ignore_eos=True)
plain = Engine(EngineConfig(speculative={"algorithm": "none"}, **base)).generate(prompts, params)
spec = Engine(EngineConfig(speculative={"algorithm": "draft", "draft": "builtin:tiny-draft", "num_steps": 3},
                           **base)).generate(prompts, params)
same = [p.token_ids == s.token_ids for p, s in zip(plain, spec)]
print({"device": "$DEVICE", "greedy_spec_equals_plain": all(same), "per_prompt": same})
raise SystemExit(0 if all(same) else 1)
EOF
if [ "$QUICK" = 1 ]; then
    step verify 120 "$PY" benchmarks/verify_bench.py --device "$DEVICE" --batch-sizes 1 --positions 1,4 --repeats 2 --iters 10
    step spec 300 "$PY" benchmarks/spec_bench.py --device "$DEVICE" --clock wall --workloads code --batch-sizes 1 \
        --steps 1,3 --quick
else
    step verify 150 "$PY" benchmarks/verify_bench.py --device "$DEVICE" --batch-sizes 1,8,32 --positions 1,2,4,8
    step spec 300 "$PY" benchmarks/spec_bench.py --device "$DEVICE" --clock wall --workloads code,random,never \
        --batch-sizes 1,8 --steps 1,2,3,5 --repeats 3 --sampled-requests 4
    step engine 150 "$PY" benchmarks/engine_bench.py --device "$DEVICE" --workloads uniform --rounds 1 --repeats 2
fi
cat "$OUT_DIR/summary.txt"
rm -rf "$PP"
