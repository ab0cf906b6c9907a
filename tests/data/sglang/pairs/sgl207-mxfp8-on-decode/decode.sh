# sgl207-mxfp8-on-decode
# expect: SGL202 --kv-cache-dtype; SGL207 --kv-cache-dtype
python -m sglang.launch_server \
  --model-path models/gpt-oss \
  --disaggregation-mode decode --host 127.0.0.1 --port 31102 \
  --disable-radix-cache \
  --page-size 16 --disaggregation-transfer-backend mooncake --kv-cache-dtype mxfp8
