# SGL301: topk given, steps and draft tokens left to SGLang (it auto-chooses all three or none)
# expect: SGL301 --speculative-eagle-topk
python -m sglang.launch_server --model-path models/llama --port 31010 \
  --speculative-algorithm EAGLE3 --speculative-draft-model-path models/llama-eagle3-draft \
  --speculative-eagle-topk 4
