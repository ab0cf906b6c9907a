# DeepSeek-V3 with its own NextN head: NEXTN and no draft path (SGLang drafts with the MTP layer)
python3 -m sglang.launch_server --model-path models/deepseek-v3-mtp --tp-size 8 --trust-remote-code \
  --speculative-algorithm NEXTN --speculative-num-steps 3 --speculative-eagle-topk 1 \
  --speculative-num-draft-tokens 4 --mem-fraction-static 0.8 --port 30000
