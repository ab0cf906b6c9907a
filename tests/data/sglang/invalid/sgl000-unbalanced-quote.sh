# SGL000: an unbalanced quote
# expect: SGL000 $
python -m sglang.launch_server --model-path "models/llama --port 31010
