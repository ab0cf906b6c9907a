# MOD706: an EAGLE3 draft run as EAGLE (SGLang starts; accept length ~1.0)
# expect: MOD706 --speculative-algorithm
python -m sglang.launch_server --model-path models/llama --port 31011 \
  --speculative-algorithm EAGLE --speculative-draft-model-path models/llama-eagle3
