# SGL214: prefill side
python -m sglang.launch_server --model-path models/llama \
  --disaggregation-mode prefill --host 127.0.0.1 --port 31101 --disaggregation-bootstrap-port 31998 \
  --tp-size 2
