# sgl201-architecture-differs
# expect: SGL201 --model-path; PD501 --model-path; PD504 --model-path; PD506 --model-path
python -m sglang.launch_server \
  --model-path models/nemotron-h \
  --disaggregation-mode decode --host 127.0.0.1 --port 31102 \
  --disable-radix-cache \
  --page-size 16 --disaggregation-transfer-backend mooncake
