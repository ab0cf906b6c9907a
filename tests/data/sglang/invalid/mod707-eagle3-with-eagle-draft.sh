# MOD707: an EAGLE(1/2) draft run as EAGLE3
# expect: MOD707 --speculative-algorithm
python -m sglang.launch_server --model-path models/llama --port 31012 \
  --speculative-algorithm EAGLE3 --speculative-draft-model-path models/llama-eagle
