# MOD703: Qwen3-Next ships an MTP head, but SGLang fills the draft path only for DeepSeek/GLM-class targets
# expect: MOD703 --speculative-algorithm
python -m sglang.launch_server --model-path models/qwen3-next --port 31015 --speculative-algorithm NEXTN
