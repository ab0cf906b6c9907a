"""Workloads: the seeded, reproducible list of prompts a bench run sends.

`build_workload(cfg)` returns `Prompt`s for one of the datasets in `config.DATASETS`:

- `random`: random lowercase words, exactly `input_len` bytes each; input and output lengths drawn
  uniformly from `[max(1, int(len * random_range_ratio)), len]` (bench_serving's semantics; the
  default ratio here is 1.0, fixed lengths, where bench_serving's is 0.0).
- `jsonl`: one JSON object per line with `prompt` (or `text`) and optional `output_len`/`max_tokens`.
- `sharegpt`: a ShareGPT-format JSON (or JSONL) file; the first human turn is the prompt, the reply's
  length (or `--sharegpt-output-len`) the output length.
- `shared-prefix`: `gsp_num_groups` system prompts, each followed by `gsp_prompts_per_group` questions.
- `code`: code-completion prompts from the local Python standard library (see `code_prompts`).

The client has no tokenizer (it must work against any server), so lengths are counted in bytes, which
equal tokens for the builtin byte-level models; reported token totals prefer the server's `usage`.
The same config always yields the same prompts in the same order; a file with fewer prompts than
`num_prompts` is cycled.
"""

from __future__ import annotations

import dataclasses
import json
import random
from pathlib import Path
from typing import Any

from specctl.bench.code_prompts import code_prompts
from specctl.bench.config import DATASETS, WorkloadConfig
from specctl.errors import UsageError

# Short ASCII words: random prompts stay printable and one byte per character.
_WORDS = (
    "def return self value data list dict item index count name path file line text node tree key "
    "result args kwargs error state size time start stop next prev first last read write open close "
    "parse token buffer stream queue cache page step batch model layer split merge check load save"
).split()


@dataclasses.dataclass(frozen=True)
class Prompt:
    """One request of the workload. `prompt_len` is in bytes (tokens for byte-level models)."""

    text: str
    prompt_len: int
    output_len: int
    group: int | None = None


def build_workload(cfg: WorkloadConfig) -> list[Prompt]:
    """The prompts for `cfg` (UsageError for an unknown dataset or an unreadable/empty file)."""
    if cfg.dataset_name not in DATASETS:
        raise UsageError(f"unknown --dataset-name {cfg.dataset_name!r}", hint=f"one of: {', '.join(DATASETS)}")
    if cfg.num_prompts < 1:
        raise UsageError("--num-prompts must be >= 1")
    rng = random.Random(cfg.seed)
    name = cfg.dataset_name
    if name == "random":
        return _random(cfg, rng)
    if name == "shared-prefix":
        return _shared_prefix(cfg, rng)
    if name == "code":
        texts = code_prompts(cfg.num_prompts, input_len=cfg.random_input_len, seed=cfg.seed)
        return _cycle([Prompt(t, len(t.encode()), cfg.random_output_len) for t in texts], cfg.num_prompts)
    path = _require_path(cfg)
    if name == "jsonl":
        return _cycle(_jsonl(path, cfg), cfg.num_prompts)
    return _cycle(_sharegpt(path, cfg, rng), cfg.num_prompts)


def random_text(rng: random.Random, length: int) -> str:
    """Exactly `length` ASCII characters of space-separated words."""
    parts: list[str] = []
    size = 0
    while size - 1 < length:  # k words joined by spaces are size - 1 characters
        word = rng.choice(_WORDS)
        parts.append(word)
        size += len(word) + 1
    return " ".join(parts)[:length]


def _lengths(rng: random.Random, n: int, length: int, ratio: float) -> list[int]:
    low = max(1, int(length * ratio))
    return [rng.randint(low, max(low, length)) for _ in range(n)]


def _random(cfg: WorkloadConfig, rng: random.Random) -> list[Prompt]:
    if cfg.random_input_len < 1 or cfg.random_output_len < 1:
        raise UsageError("--random-input-len and --random-output-len must be >= 1")
    if not 0.0 <= cfg.random_range_ratio <= 1.0:
        raise UsageError("--random-range-ratio must be in [0, 1]")
    ins = _lengths(rng, cfg.num_prompts, cfg.random_input_len, cfg.random_range_ratio)
    outs = _lengths(rng, cfg.num_prompts, cfg.random_output_len, cfg.random_range_ratio)
    return [Prompt(random_text(rng, i), i, o) for i, o in zip(ins, outs, strict=True)]


def _shared_prefix(cfg: WorkloadConfig, rng: random.Random) -> list[Prompt]:
    if min(cfg.gsp_num_groups, cfg.gsp_prompts_per_group, cfg.gsp_system_prompt_len, cfg.gsp_output_len) < 1:
        raise UsageError("--gsp-* values must be >= 1")
    out: list[Prompt] = []
    for group in range(cfg.gsp_num_groups):
        system = random_text(rng, cfg.gsp_system_prompt_len)
        for _ in range(cfg.gsp_prompts_per_group):
            text = system + "\n\n" + random_text(rng, max(1, cfg.gsp_question_len))
            out.append(Prompt(text, len(text.encode()), cfg.gsp_output_len, group))
    # Interleave groups so that requests sharing a prefix do not all arrive back to back.
    rng.shuffle(out)
    return out


def _require_path(cfg: WorkloadConfig) -> Path:
    if not cfg.dataset_path:
        raise UsageError(f"--dataset-name {cfg.dataset_name} needs --dataset-path FILE")
    path = Path(cfg.dataset_path)
    if not path.is_file():
        raise UsageError(f"--dataset-path {path}: no such file")
    return path


def _read_records(path: Path) -> list[Any]:
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise UsageError(f"cannot read {path}: {exc}") from None
    stripped = text.lstrip()
    if stripped.startswith("["):
        try:
            data = json.loads(text)
        except json.JSONDecodeError as exc:
            raise UsageError(f"{path}: not valid JSON: {exc}") from None
        return list(data)
    records = []
    for lineno, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        try:
            records.append(json.loads(line))
        except json.JSONDecodeError as exc:
            raise UsageError(f"{path}:{lineno}: not valid JSON: {exc.msg}") from None
    return records


def _jsonl(path: Path, cfg: WorkloadConfig) -> list[Prompt]:
    out = []
    for i, rec in enumerate(_read_records(path), 1):
        output_len: object
        if isinstance(rec, str):
            text, output_len = rec, cfg.random_output_len
        elif isinstance(rec, dict) and isinstance(rec.get("prompt", rec.get("text")), str):
            text = str(rec.get("prompt", rec.get("text")))
            output_len = rec.get("output_len", rec.get("max_tokens", cfg.random_output_len))
        else:
            raise UsageError(f"{path}: record {i} has no string 'prompt' (or 'text') field")
        if not isinstance(output_len, int) or isinstance(output_len, bool) or output_len < 1:
            raise UsageError(f"{path}: record {i}: output_len must be a positive integer")
        out.append(Prompt(text, len(text.encode()), output_len))
    if not out:
        raise UsageError(f"{path}: no prompts")
    return out


def _sharegpt(path: Path, cfg: WorkloadConfig, rng: random.Random) -> list[Prompt]:
    out = []
    for rec in _read_records(path):
        turns = rec.get("conversations", rec.get("conversation")) if isinstance(rec, dict) else None
        if not isinstance(turns, list) or len(turns) < 2:
            continue
        first, reply = turns[0], turns[1]
        if not (isinstance(first, dict) and isinstance(reply, dict)):
            continue
        text, answer = first.get("value"), reply.get("value")
        if not isinstance(text, str) or not isinstance(answer, str):
            continue
        output_len = cfg.sharegpt_output_len or len(answer.encode())
        # bench_serving drops conversations too short to measure.
        if len(text.encode()) < 4 or output_len < 4:
            continue
        out.append(Prompt(text, len(text.encode()), output_len))
    if not out:
        raise UsageError(f"{path}: no usable ShareGPT conversations",
                         hint='expected [{"conversations": [{"from": "human", "value": ...}, {"from": "gpt", ...}]}]')
    rng.shuffle(out)
    return out


def _cycle(prompts: list[Prompt], n: int) -> list[Prompt]:
    return [prompts[i % len(prompts)] for i in range(n)]
