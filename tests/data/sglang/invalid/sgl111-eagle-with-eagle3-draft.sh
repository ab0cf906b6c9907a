# SGL111: EAGLE with an EAGLE3 draft (SGLang runs it; every draft is rejected)
# expect: SGL111 --speculative-algorithm
python -m sglang.launch_server --model-path models/llama --port 31010 \
  --speculative-algorithm EAGLE --speculative-draft-model-path models/llama-eagle3-draft \
  --speculative-num-steps 3 --speculative-eagle-topk 1 --speculative-num-draft-tokens 4
