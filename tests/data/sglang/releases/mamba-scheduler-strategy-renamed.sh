# --mamba-scheduler-strategy: renamed --mamba-radix-cache-strategy (the same dest).
# release 0.5.12: clean
# release 0.5.23: SGL006 --mamba-scheduler-strategy error
python -m sglang.launch_server --model-path models/llama --port 31010 \
  --mamba-scheduler-strategy no_buffer
