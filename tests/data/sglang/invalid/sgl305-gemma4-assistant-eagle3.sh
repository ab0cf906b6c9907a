# SGL305: a Gemma 4 assistant draft with EAGLE3 (it runs as FROZEN_KV_MTP from EAGLE or NEXTN)
# expect: SGL305 --speculative-algorithm
python -m sglang.launch_server --model-path models/gemma4 --port 31010 \
  --speculative-algorithm EAGLE3 --speculative-draft-model-path models/gemma4-assistant-draft \
  --speculative-num-steps 3 --speculative-eagle-topk 1 --speculative-num-draft-tokens 4
