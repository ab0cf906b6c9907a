# SGL114: EAGLE3 without a draft on a model with no MTP head
# expect: SGL114 --speculative-algorithm
python -m sglang.launch_server --model-path models/llama --port 31010 \
  --speculative-algorithm EAGLE3 --speculative-num-steps 3 --speculative-eagle-topk 1 \
  --speculative-num-draft-tokens 4
