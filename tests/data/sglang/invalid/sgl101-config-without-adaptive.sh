# SGL101: --speculative-adaptive-config without --speculative-adaptive is silently ignored
# expect: SGL101 --speculative-adaptive-config
python -m sglang.launch_server --model-path models/llama --port 31010 \
  --speculative-algorithm EAGLE --speculative-draft-model-path models/llama-draft \
  --speculative-num-steps 3 --speculative-eagle-topk 1 --speculative-num-draft-tokens 4 \
  --speculative-adaptive-config adaptive.json
