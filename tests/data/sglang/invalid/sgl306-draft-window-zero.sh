# SGL306: a draft window of 0 tokens
# expect: SGL306 --speculative-draft-window-size
python -m sglang.launch_server --model-path models/llama --port 31010 \
  --speculative-algorithm EAGLE3 --speculative-draft-model-path models/llama-eagle3-draft \
  --speculative-num-steps 3 --speculative-eagle-topk 1 --speculative-num-draft-tokens 4 \
  --speculative-draft-window-size 0
