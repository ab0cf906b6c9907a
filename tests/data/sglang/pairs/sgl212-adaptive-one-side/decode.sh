# sgl212-adaptive-one-side: decode adapts (SGLang's default table: steps 3), prefill drafts one static step
# expect: SGL212 --speculative-adaptive; SGL211 --speculative-num-steps; SGL211 --speculative-num-draft-tokens
python -m sglang.launch_server --model-path models/llama \
  --disaggregation-mode decode --host 127.0.0.1 --port 31102 --disable-radix-cache \
  --speculative-algorithm EAGLE3 --speculative-draft-model-path models/llama-eagle3-draft \
  --speculative-adaptive
