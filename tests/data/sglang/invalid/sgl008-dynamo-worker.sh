# SGL008: NVIDIA Dynamo's SGLang worker takes SGLang's flags plus its own; Dynamo's are skipped with
# their values (named in one info), SGLang's are checked (the bad --page-size value is reported).
# expect: SGL008 $; SGL003 --page-size
python3 -m dynamo.sglang --model-path models/llama --endpoint dyn://dynamo.backend.generate \
  --dyn-tool-call-parser hermes --connector nixl kvbm --router-mode kv --page-size sixteen \
  --tp-size 1
