# sgl203-transfer-backend-differs
# expect: SGL203 --disaggregation-transfer-backend
python -m sglang.launch_server \
  --model-path models/llama \
  --disaggregation-mode decode --host 127.0.0.1 --port 31102 \
  --disable-radix-cache \
  --page-size 16 --disaggregation-transfer-backend nixl
