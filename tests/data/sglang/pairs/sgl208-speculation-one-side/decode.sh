# sgl208-speculation-one-side
# expect: SGL208 --speculative-algorithm
python -m sglang.launch_server \
  --model-path models/llama \
  --disaggregation-mode decode --host 127.0.0.1 --port 31102 \
  --disable-radix-cache \
  --page-size 16 --disaggregation-transfer-backend mooncake
