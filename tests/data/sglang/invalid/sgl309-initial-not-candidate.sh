# An existing rule on SGLang input: the initial step is not a candidate (SGLang refuses at start-up)
# expect: SGL309 --speculative-num-steps
python -m sglang.launch_server --model-path models/llama --port 31010 \
  --speculative-algorithm EAGLE --speculative-draft-model-path models/llama-draft \
  --speculative-num-steps 4 --speculative-adaptive --speculative-adaptive-config adaptive.json \
  --cuda-graph-bs-decode 1 2 4 8 16 --max-running-requests 16
