# SGL007: a choice other SGLang releases accept (--attention-backend cutlass_mla, up to 0.5.16),
# not the installed (or newest) release: a warning (an error with --sglang-version).
# expect: SGL007 --attention-backend
python -m sglang.launch_server --model-path models/llama --port 31010 \
  --attention-backend cutlass_mla
