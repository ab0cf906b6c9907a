# SGL102: adaptive is silently turned off for --speculative-eagle-topk > 1
# expect: SGL102 --speculative-eagle-topk
python -m sglang.launch_server --model-path models/llama --port 31010 \
  --speculative-algorithm EAGLE --speculative-draft-model-path models/llama-draft \
  --speculative-num-steps 3 --speculative-eagle-topk 4 \
  --speculative-adaptive --speculative-adaptive-config adaptive.json
