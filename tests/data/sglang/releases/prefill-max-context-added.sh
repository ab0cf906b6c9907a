# --cuda-graph-prefill-max-context: added later; an older release refuses it.
# release 0.5.16: SGL006 --cuda-graph-prefill-max-context error
# release 0.5.23: clean
python -m sglang.launch_server --model-path models/llama --port 31010 \
  --cuda-graph-prefill-max-context 4096
