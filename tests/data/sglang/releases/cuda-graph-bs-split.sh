# --cuda-graph-bs / --cuda-graph-max-bs (as aiconfigurator writes them for SGLang 0.5.16): flags of their
# own up to 0.5.13, deprecated aliases of the -decode flags from 0.5.14, gone since (split into
# -decode/-prefill); --cuda-graph-max-bs is then an ambiguous abbreviation.
# release 0.5.13: clean
# release 0.5.16: SGL003 --cuda-graph-bs warning; SGL003 --cuda-graph-max-bs warning
# release 0.5.23: SGL006 --cuda-graph-bs error; SGL006 --cuda-graph-max-bs error
python -m sglang.launch_server --model-path models/llama --port 31010 \
  --cuda-graph-bs 1 2 4 8 --cuda-graph-max-bs 8
