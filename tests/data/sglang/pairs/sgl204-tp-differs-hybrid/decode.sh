# sgl204-tp-differs-hybrid
# expect: SGL204 --tp-size
python -m sglang.launch_server \
  --model-path models/qwen3-next \
  --disaggregation-mode decode --host 127.0.0.1 --port 31102 \
  --disable-radix-cache \
  --page-size 16 --disaggregation-transfer-backend mooncake --tp-size 4
