# Llama with an EAGLE3 draft, a draft tree of topk 4
python3 -m sglang.launch_server --model-path models/llama \
  --speculative-algorithm EAGLE3 --speculative-draft-model-path models/llama-eagle3-draft \
  --speculative-num-steps 5 --speculative-eagle-topk 4 --speculative-num-draft-tokens 8 \
  --mem-fraction-static 0.7 --cuda-graph-max-bs-decode 8 --port 30000
