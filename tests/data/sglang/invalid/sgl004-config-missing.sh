# SGL004: --config names a file that does not exist (relative to this file)
# expect: SGL004 --config
python -m sglang.launch_server --model-path models/llama --port 31010 --config no-such.yaml
