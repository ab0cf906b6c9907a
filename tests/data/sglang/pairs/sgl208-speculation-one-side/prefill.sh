# SGL208: prefill side
python -m sglang.launch_server \
  --model-path models/llama \
  --disaggregation-mode prefill --host 127.0.0.1 --port 31101 \
  --disaggregation-bootstrap-port 31998 \
  --page-size 16 --disaggregation-transfer-backend mooncake --speculative-algorithm EAGLE --speculative-draft-model-path models/llama-draft --speculative-num-steps 3 --speculative-eagle-topk 1 --speculative-num-draft-tokens 4
