# SGL301: steps given without topk (SGLang leaves topk unset and fails comparing it)
# expect: SGL301 --speculative-num-steps
python -m sglang.launch_server --model-path models/llama --port 31010 \
  --speculative-algorithm EAGLE3 --speculative-draft-model-path models/llama-eagle3-draft \
  --speculative-num-steps 3
