# SGL304: SGLANG_ENABLE_SPEC_V2=1 with a draft tree: 0.5.7-0.5.10 refuse it, 0.5.23 ignores the variable
# expect: SGL304 SGLANG_ENABLE_SPEC_V2
SGLANG_ENABLE_SPEC_V2=1 python -m sglang.launch_server --model-path models/llama --port 31010 \
  --speculative-algorithm EAGLE3 --speculative-draft-model-path models/llama-eagle3-draft \
  --speculative-num-steps 3 --speculative-eagle-topk 4 --speculative-num-draft-tokens 8
