"""Write the builtin models' `tokenizer.json` + `tokenizer_config.json`: a byte-level tokenizer in the Hugging
Face format whose ids equal specctl's `ByteTokenizer` (UTF-8 bytes 0-255, then <|bos|> 256, <|eos|> 257,
<|pad|> 258), so sglang-router's tokenizers crate, SGLang's bench_serving, guidellm and vLLM's bench load
the builtin models from their local directory with no hub and count the same tokens the engine does.

A BPE with the 256 byte symbols as its whole vocabulary and no merges, behind the ByteLevel pre-tokenizer
(GPT-2's byte-to-printable-character map, without its regex split or prefix space), is exactly "one token per
byte". Run: `python scripts/write_byte_tokenizer.py` (rewrites the files of every builtin model).
"""

from __future__ import annotations

import json
from pathlib import Path

SPECIALS = {"<|bos|>": 256, "<|eos|>": 257, "<|pad|>": 258}
MODELS = Path(__file__).resolve().parent.parent / "engine" / "builtin_models"


def byte_symbols() -> list[str]:
    """GPT-2's reversible map of the 256 byte values to printable characters (the ByteLevel alphabet):
    printable Latin-1 bytes map to themselves, the others to U+0100 onwards, in byte order."""
    keep = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    out, extra = {}, 0
    for b in range(256):
        if b in keep:
            out[b] = chr(b)
        else:
            out[b] = chr(256 + extra)
            extra += 1
    return [out[b] for b in range(256)]


def tokenizer_json() -> dict:
    vocab = {sym: i for i, sym in enumerate(byte_symbols())}
    vocab.update(SPECIALS)
    added = [{"id": i, "content": s, "single_word": False, "lstrip": False, "rstrip": False, "normalized": False,
              "special": True} for s, i in SPECIALS.items()]
    return {
        "version": "1.0",
        "truncation": None,
        "padding": None,
        "added_tokens": added,
        "normalizer": None,
        "pre_tokenizer": {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": False, "use_regex": False},
        "post_processor": None,
        "decoder": {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": False, "use_regex": False},
        "model": {"type": "BPE", "dropout": None, "unk_token": None, "continuing_subword_prefix": None,
                  "end_of_word_suffix": None, "fuse_unk": False, "byte_fallback": False, "ignore_merges": False,
                  "vocab": vocab, "merges": []},
    }


def tokenizer_config(max_len: int) -> dict:
    return {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "bos_token": "<|bos|>",
        "eos_token": "<|eos|>",
        "pad_token": "<|pad|>",
        "add_bos_token": False,
        "add_eos_token": False,
        "clean_up_tokenization_spaces": False,
        "model_max_length": max_len,
        "added_tokens_decoder": {str(i): {"content": s, "special": True, "lstrip": False, "rstrip": False,
                                          "normalized": False, "single_word": False} for s, i in SPECIALS.items()},
    }


def main() -> None:
    for model_dir in sorted(p for p in MODELS.iterdir() if (p / "config.json").is_file()):
        cfg = json.loads((model_dir / "config.json").read_text(encoding="utf-8"))
        if cfg.get("tokenizer") != "bytes":
            continue
        cfg_out = tokenizer_config(int(cfg.get("max_position_embeddings", 4096)))
        # The model directory (sglang-router's tokenizers crate reads it) and `tokenizer/`, a directory of
        # tokenizer files only: transformers' AutoTokenizer would read the model's config.json, whose
        # architecture it does not know, from the model directory.
        for out in (model_dir, model_dir / "tokenizer"):
            out.mkdir(exist_ok=True)
            (out / "tokenizer.json").write_text(json.dumps(tokenizer_json(), ensure_ascii=False, indent=1) + "\n",
                                                encoding="utf-8")
            (out / "tokenizer_config.json").write_text(json.dumps(cfg_out, indent=1) + "\n", encoding="utf-8")
            print(f"wrote {out / 'tokenizer.json'}")


if __name__ == "__main__":
    main()
