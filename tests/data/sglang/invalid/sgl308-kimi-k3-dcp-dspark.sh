# SGL308: Kimi-K3 DCP + DSPARK needs the static ragged-verify mode (the default)
# expect: SGL308 SGLANG_RAGGED_VERIFY_MODE
export SGLANG_RAGGED_VERIFY_MODE=compact
python -m sglang.launch_server --model-path models/kimi-k3 --port 31010 \
  --tp-size 8 --dcp-size 8 --speculative-algorithm DSPARK --speculative-draft-model-path models/kimi-k3-dspark
