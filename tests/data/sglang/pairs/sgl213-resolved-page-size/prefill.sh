# SGL213: prefill side (trtllm_mha: SGLang raises the page size to 64)
python -m sglang.launch_server --model-path models/llama \
  --disaggregation-mode prefill --host 127.0.0.1 --port 31101 --disaggregation-bootstrap-port 31998 \
  --attention-backend trtllm_mha
