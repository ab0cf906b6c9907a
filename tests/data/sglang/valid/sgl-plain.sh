# passes SGL000-SGL004: one command with continuations, comments, quoting, VAR= prefixes and a --config
CUDA_VISIBLE_DEVICES=0 HF_HUB_OFFLINE=1 python3 -m sglang.launch_server \
  --model-path 'models/llama' \
  --port 31010 --host "127.0.0.1" \
  --config server.yaml   # page size and dtype live in the YAML
