#!/bin/sh
# Prefill of a Qwen3-Next PD pair with adaptive EAGLE speculation.
CUDA_VISIBLE_DEVICES=0 python -m sglang.launch_server \
  --model-path models/qwen3-next \
  --disaggregation-mode prefill \
  --disaggregation-transfer-backend mooncake \
  --host 127.0.0.1 --port 31001 --disaggregation-bootstrap-port 31998 \
  --page-size 16 --tp-size 2 \
  --speculative-algorithm EAGLE --speculative-draft-model-path models/qwen3-next \
  --speculative-adaptive --speculative-adaptive-config adaptive.json --speculative-num-steps 3 \
  --cuda-graph-bs-decode 1 2 4 8 16 32 --max-running-requests 32
