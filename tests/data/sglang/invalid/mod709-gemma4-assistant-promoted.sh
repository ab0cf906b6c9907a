# MOD709: SGLang promotes NEXTN to FROZEN_KV_MTP for a Gemma 4 assistant draft (info)
# expect: MOD709 --speculative-algorithm
python -m sglang.launch_server --model-path models/gemma4 --port 31014 \
  --speculative-algorithm NEXTN --speculative-draft-model-path models/gemma4-assistant
