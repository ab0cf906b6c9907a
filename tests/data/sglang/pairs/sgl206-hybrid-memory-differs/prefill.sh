# SGL206: prefill side
python -m sglang.launch_server \
  --model-path models/qwen3-next \
  --disaggregation-mode prefill --host 127.0.0.1 --port 31101 \
  --disaggregation-bootstrap-port 31998 \
  --page-size 16 --disaggregation-transfer-backend mooncake --mamba-full-memory-ratio 0.9
