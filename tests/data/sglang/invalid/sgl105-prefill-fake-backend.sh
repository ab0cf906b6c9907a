# SGL105: prefill with the fake transfer backend sends no KV
# expect: SGL105 --disaggregation-transfer-backend
python -m sglang.launch_server --model-path models/llama --port 31010 \
  --disaggregation-mode prefill --disaggregation-bootstrap-port 31998 \
  --disaggregation-transfer-backend fake
