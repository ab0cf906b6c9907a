# SGL112: mori cannot send the MXFP8 block scales this model registers
# expect: SGL112 --disaggregation-transfer-backend
python -m sglang.launch_server --model-path models/llama --port 31010 \
  --disaggregation-mode prefill --disaggregation-bootstrap-port 31998 \
  --disaggregation-transfer-backend mori --kv-cache-dtype mxfp8
