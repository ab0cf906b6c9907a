# SGL006: a flag of other SGLang releases (0.5.16 and before), split into -decode/-prefill since;
# checked against the installed (or newest) release, which does not declare it: a warning
# (an error with --sglang-version).
# expect: SGL006 --cuda-graph-max-bs
python -m sglang.launch_server --model-path models/llama --port 31010 \
  --cuda-graph-max-bs 32
