# SGL113: mooncake encoder transfer needs HTTP encoders
# expect: SGL113 --encoder-transfer-backend
SGLANG_ENCODER_MM_RECEIVER_MODE=grpc python -m sglang.launch_server --model-path models/qwen3-vl --port 31010 \
  --language-only --encoder-urls grpc://127.0.0.1:50051 --encoder-transfer-backend mooncake
