# SGL204: prefill side (attention DP 4: attention TP 1)
python -m sglang.launch_server --model-path models/gpt-oss \
  --disaggregation-mode prefill --host 127.0.0.1 --port 31101 --disaggregation-bootstrap-port 31998 \
  --disaggregation-transfer-backend nixl --tp-size 4 --attn-dp-size 4
