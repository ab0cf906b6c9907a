#!/bin/sh
# Decode of the same pair: everything prefill and decode exchange agrees.
CUDA_VISIBLE_DEVICES=1 python3 -m sglang.launch_server \
  --model-path models/qwen3-next \
  --disaggregation-mode decode --disable-radix-cache \
  --disaggregation-transfer-backend mooncake \
  --host 127.0.0.1 --port 31002 \
  --page-size 16 --tp-size 2 \
  --speculative-algorithm EAGLE --speculative-draft-model-path models/qwen3-next \
  --speculative-adaptive --speculative-adaptive-config adaptive.json --speculative-num-steps 3 \
  --cuda-graph-bs-decode 1 2 4 8 16 32 --max-running-requests 32
