# SGL001: an unknown flag (the closest is --speculative-num-steps)
# expect: SGL001 --speculative-num-stepz
python -m sglang.launch_server --model-path models/llama --port 31010 \
  --speculative-num-stepz 3
