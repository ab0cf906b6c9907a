# SGL104: the adaptive config does not exist (relative to this file)
# expect: SGL104 --speculative-adaptive-config
python -m sglang.launch_server --model-path models/llama --port 31010 \
  --speculative-algorithm EAGLE --speculative-draft-model-path models/llama-draft \
  --speculative-adaptive --speculative-adaptive-config missing.json
