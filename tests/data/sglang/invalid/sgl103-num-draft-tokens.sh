# SGL103: SGLang replaces --speculative-num-draft-tokens by steps + 1 under adaptive
# expect: SGL103 --speculative-num-draft-tokens
python -m sglang.launch_server --model-path models/llama --port 31010 \
  --speculative-algorithm EAGLE --speculative-draft-model-path models/llama-draft \
  --speculative-num-steps 3 --speculative-num-draft-tokens 8 \
  --speculative-adaptive --speculative-adaptive-config adaptive.json
