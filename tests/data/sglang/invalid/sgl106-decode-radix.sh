# SGL106: SGLang turns the radix cache off on decode
# expect: SGL106 --disaggregation-mode
python -m sglang.launch_server --model-path models/llama --port 31010 --disaggregation-mode decode
