# SGL000: two launch commands in one file
# expect: SGL000 $
python -m sglang.launch_server --model-path models/llama --port 31010
python -m sglang.launch_server --model-path models/llama --port 31011
