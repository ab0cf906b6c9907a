# SGL307: DFLASH runs on CUDA, NPU and XPU only
# expect: SGL307 --device
python -m sglang.launch_server --model-path models/llama --port 31010 \
  --device cpu --speculative-algorithm DFLASH --speculative-draft-model-path models/llama-draft
