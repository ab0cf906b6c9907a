# SGL102: adaptive is silently turned off by two-batch overlap
# expect: SGL102 --enable-two-batch-overlap
python -m sglang.launch_server --model-path models/llama --port 31010 \
  --speculative-algorithm EAGLE --speculative-draft-model-path models/llama-draft \
  --speculative-num-steps 3 --speculative-eagle-topk 1 --enable-two-batch-overlap \
  --speculative-adaptive --speculative-adaptive-config adaptive.json
