# SGL204: prefill side
python -m sglang.launch_server \
  --model-path models/gpt-oss \
  --disaggregation-mode prefill --host 127.0.0.1 --port 31101 \
  --disaggregation-bootstrap-port 31998 \
  --page-size 16 --disaggregation-transfer-backend nixl --tp-size 2
