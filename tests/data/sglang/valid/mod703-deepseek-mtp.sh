# DeepSeek-V3.1 (num_nextn_predict_layers: 1): SGLang uses the target's own NextN head as the draft
python -m sglang.launch_server --model-path models/deepseek-v3.1 --port 31017 --speculative-algorithm EAGLE \
  --speculative-num-steps 3 --speculative-eagle-topk 1 --speculative-num-draft-tokens 4
