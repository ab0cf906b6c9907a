# sgl214-decode-dcp-without-mla: decode context parallelism needs an MLA KV pool
# expect: SGL214 --dcp-size
python -m sglang.launch_server --model-path models/llama \
  --disaggregation-mode decode --host 127.0.0.1 --port 31102 --disable-radix-cache \
  --tp-size 2 --dcp-size 2
