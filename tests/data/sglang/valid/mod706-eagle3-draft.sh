# an EAGLE3 draft run as EAGLE3
python -m sglang.launch_server --model-path models/llama --port 31018 \
  --speculative-algorithm EAGLE3 --speculative-draft-model-path models/llama-eagle3
