# sgl205-mamba-ssm-dtype-differs
# expect: SGL205 --mamba-ssm-dtype
python -m sglang.launch_server \
  --model-path models/nemotron-h \
  --disaggregation-mode decode --host 127.0.0.1 --port 31102 \
  --disable-radix-cache \
  --page-size 16 --disaggregation-transfer-backend mooncake --mamba-ssm-dtype bfloat16
