# sgl210-kv-layout-differs
# expect: SGL210 --dsv4-attn-backend
python -m sglang.launch_server \
  --model-path models/deepseek-v4 \
  --disaggregation-mode decode --host 127.0.0.1 --port 31102 \
  --disable-radix-cache \
  --page-size 16 --disaggregation-transfer-backend mooncake --dsv4-attn-backend flashmla
