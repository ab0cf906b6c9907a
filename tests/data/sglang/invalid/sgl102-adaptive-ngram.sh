# SGL102: adaptive is silently turned off for NGRAM (only EAGLE/EAGLE3 adapt)
# expect: SGL102 --speculative-algorithm
python -m sglang.launch_server --model-path models/llama --port 31010 \
  --speculative-algorithm NGRAM --speculative-num-steps 3 \
  --speculative-adaptive --speculative-adaptive-config adaptive.json
