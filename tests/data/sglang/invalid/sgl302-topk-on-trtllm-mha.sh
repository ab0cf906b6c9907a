# SGL302: a draft tree (topk 4) on trtllm_mha, which verifies chains only
# expect: SGL302 --speculative-eagle-topk
python -m sglang.launch_server --model-path models/llama --port 31010 \
  --attention-backend trtllm_mha --page-size 64 \
  --speculative-algorithm EAGLE3 --speculative-draft-model-path models/llama-eagle3-draft \
  --speculative-num-steps 3 --speculative-eagle-topk 4 --speculative-num-draft-tokens 8
