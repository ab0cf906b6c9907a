# sgl207-state-types-differ
# expect: SGL206 --disable-hybrid-swa-memory; SGL207 --disable-hybrid-swa-memory
python -m sglang.launch_server \
  --model-path models/gpt-oss \
  --disaggregation-mode decode --host 127.0.0.1 --port 31102 \
  --disable-radix-cache \
  --page-size 16 --disaggregation-transfer-backend mooncake --disable-hybrid-swa-memory
