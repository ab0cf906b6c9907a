# sgl204-tp-differs-hybrid: a sliding-window hybrid (gpt-oss) over nixl cannot reslice its SWA state
# expect: SGL204 --tp-size
python -m sglang.launch_server \
  --model-path models/gpt-oss \
  --disaggregation-mode decode --host 127.0.0.1 --port 31102 \
  --disable-radix-cache \
  --page-size 16 --disaggregation-transfer-backend nixl --tp-size 4
