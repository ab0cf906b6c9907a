#!/bin/sh
# Decode that disagrees with prefill on everything SGLang finds late.
python3 -m sglang.launch_server \
  --model-path models/qwen3-next \
  --disaggregation-mode decode \
  --disaggregation-transfer-backend nixl \
  --host 127.0.0.1 --port 31002 \
  --page-size 32 --tp-size 4 --kv-cache-dtype fp8_e4m3 --mamba-ssm-dtype bfloat16 \
  --speculative-algorithm EAGLE --speculative-draft-model-path models/qwen3-next \
  --speculative-adaptive-config adaptive.json --speculative-num-steps 3 \
  --cuda-graph-bs-decode 1 2 4 8 16 32 --max-running-requests 32
