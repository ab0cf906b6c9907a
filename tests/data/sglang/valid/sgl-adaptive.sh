# passes SGL101-SGL104: adaptive EAGLE with its config, topk 1, no num_draft_tokens
sglang serve --model-path models/llama --port 31010 \
  --speculative-algorithm EAGLE --speculative-draft-model-path models/llama-draft \
  --speculative-num-steps 3 --speculative-eagle-topk 1 \
  --speculative-adaptive --speculative-adaptive-config adaptive.json \
  --cuda-graph-bs-decode 1 2 4 8 16 32 --max-running-requests 32
