# sgl211-steps-differ: decode drafts five steps, prefill three
# expect: SGL211 --speculative-num-steps; SGL211 --speculative-num-draft-tokens
python -m sglang.launch_server --model-path models/llama \
  --disaggregation-mode decode --host 127.0.0.1 --port 31102 --disable-radix-cache \
  --speculative-algorithm EAGLE3 --speculative-draft-model-path models/llama-eagle3-draft \
  --speculative-num-steps 5 --speculative-eagle-topk 1 --speculative-num-draft-tokens 6
