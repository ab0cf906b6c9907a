# passes SGL105: prefill with a real transfer backend
python -m sglang.launch_server --model-path models/llama --port 31010 \
  --disaggregation-mode prefill --disaggregation-bootstrap-port 31998 \
  --disaggregation-transfer-backend mooncake
