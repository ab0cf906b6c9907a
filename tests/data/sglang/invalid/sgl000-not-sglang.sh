# SGL000: a command that is not SGLang's server
# expect: SGL000 $
vllm serve models/llama --port 31010
