# SGL003: --model-path is required
# expect: SGL003 --model-path
sglang serve --port 31010
