# MOD708: SGLang refuses a Gemma 4 assistant draft with EAGLE3
# expect: MOD708 --speculative-algorithm
python -m sglang.launch_server --model-path models/gemma4 --port 31013 \
  --speculative-algorithm EAGLE3 --speculative-draft-model-path models/gemma4-assistant
