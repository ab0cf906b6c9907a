# --attention-backend cutlass_mla: a choice of older releases only.
# release 0.5.16: clean
# release 0.5.23: SGL007 --attention-backend error
python -m sglang.launch_server --model-path models/llama --port 31010 \
  --attention-backend cutlass_mla
