# sgl213-resolved-page-size: neither side writes --page-size; SGLang picks 64 for prefill's trtllm_mha, 1 here
# expect: SGL213 --page-size
python -m sglang.launch_server --model-path models/llama \
  --disaggregation-mode decode --host 127.0.0.1 --port 31102 --disable-radix-cache \
  --attention-backend fa3
