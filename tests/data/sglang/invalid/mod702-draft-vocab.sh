# MOD702: a draft with another tokenizer
# expect: MOD702 --speculative-draft-model-path
python -m sglang.launch_server --model-path models/llama --port 31016 \
  --speculative-algorithm EAGLE3 --speculative-draft-model-path models/qwen2
