# SGL004: the --config file names another config (here itself: a loop)
# expect: SGL004 --config
python -m sglang.launch_server --model-path models/llama --port 31010 --config sgl004-config-loop.yaml
