# passes SGL106: decode says its radix cache is off
python -m sglang.launch_server --model-path models/llama --port 31010 \
  --disaggregation-mode decode --disable-radix-cache
