# SGL300: one of SGLang's other start-up checks (quoted in the finding)
# expect: SGL300 --disaggregation-decode-host-receive-threshold
python -m sglang.launch_server --model-path models/llama --port 31010 \
  --disaggregation-mode decode --disable-radix-cache --disaggregation-decode-host-receive-threshold 1.5
