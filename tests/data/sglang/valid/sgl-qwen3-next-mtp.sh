# Qwen3-Next with its built-in MTP head (the recipe: NEXTN, no draft path)
python3 -m sglang.launch_server --model-path models/qwen3-next --tp-size 4 \
  --speculative-algorithm NEXTN --speculative-num-steps 3 --speculative-eagle-topk 1 \
  --speculative-num-draft-tokens 4 --port 30000
