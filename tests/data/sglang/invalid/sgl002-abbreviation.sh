# SGL002: a prefix abbreviation SGLang accepts
# expect: SGL002 --max-running-requests
python -m sglang.launch_server --model-path models/llama --port 31010 --max-running-req 16
