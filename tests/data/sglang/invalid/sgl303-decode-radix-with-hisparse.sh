# SGL303: decode radix cache with HiSparse
# expect: SGL303 --disaggregation-decode-enable-radix-cache
python -m sglang.launch_server --model-path models/llama --port 31010 \
  --disaggregation-mode decode --disaggregation-decode-enable-radix-cache --enable-hisparse
