# sgl202-kv-cache-dtype-differs
# expect: SGL202 --kv-cache-dtype
python -m sglang.launch_server \
  --model-path models/llama \
  --disaggregation-mode decode --host 127.0.0.1 --port 31102 \
  --disable-radix-cache \
  --page-size 16 --disaggregation-transfer-backend mooncake --kv-cache-dtype fp8_e4m3
