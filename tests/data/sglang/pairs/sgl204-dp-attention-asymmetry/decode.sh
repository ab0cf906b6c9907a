# sgl204-dp-attention-asymmetry: both sides --tp-size 4, but only prefill shards attention by DP
# expect: SGL204 --attn-dp-size
python -m sglang.launch_server --model-path models/gpt-oss \
  --disaggregation-mode decode --host 127.0.0.1 --port 31102 --disable-radix-cache \
  --disaggregation-transfer-backend nixl --tp-size 4
