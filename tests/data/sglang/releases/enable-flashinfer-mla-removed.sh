# --enable-flashinfer-mla: a switch of 0.4.3-0.4.5; 0.4.6-0.4.7 declare it only to refuse it at start-up
# (their DeprecatedAction raises, pointing at --attention-backend); later releases do not declare it.
# release 0.4.5: clean
# release 0.4.7: SGL003 --enable-flashinfer-mla error
# release 0.5.23: SGL006 --enable-flashinfer-mla error
python -m sglang.launch_server --model-path models/llama --port 31010 \
  --enable-flashinfer-mla
