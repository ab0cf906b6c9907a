# SGL003: wrong type, wrong choice and a missing value, all reported at once
# expect: SGL003 --page-size; SGL003 --dtype; SGL003 --port
python -m sglang.launch_server --model-path models/llama --page-size sixteen --dtype bf16 --port
