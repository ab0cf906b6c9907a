# --keep-mm-feature-on-device: removed.
# release 0.5.20: clean
# release 0.5.23: SGL006 --keep-mm-feature-on-device error
python -m sglang.launch_server --model-path models/llama --port 31010 \
  --keep-mm-feature-on-device
