# SGL310: NEXTN runs as EAGLE, the draft is the model's own MTP head, steps are auto-chosen (all silent)
# expect: SGL310 --speculative-algorithm; SGL310 --speculative-draft-model-path; SGL310 --speculative-num-steps
python -m sglang.launch_server --model-path models/deepseek-v3-mtp --port 31010 --tp-size 8 \
  --speculative-algorithm NEXTN
