"""The builtin code-completion workload: Python source ending at a function header.

The builtin models are byte-level and trained on CPython's standard library, so the natural prompt
for them is stdlib source cut just after a `def ...:` line, leaving the body to complete. Prompts are
read at runtime from the local stdlib (`sysconfig`'s "stdlib" path), picking files and functions
with a fixed seed, so the same Python version always gives the same prompts. Where the stdlib ships
without sources, a small shipped list of headers is used instead.
"""

from __future__ import annotations

import random
import re
import sysconfig
from pathlib import Path

_HEADER = re.compile(r"^[ \t]*(?:async[ \t]+)?def [A-Za-z_]\w*\(.*\)[^\n]*:[ \t]*$", re.MULTILINE)

_FALLBACK = (
    "import os\n\n\ndef read_text(path, encoding='utf-8'):\n",
    "class Stack:\n    def __init__(self):\n        self._items = []\n\n    def push(self, item):\n",
    "def fibonacci(n):\n    \"\"\"Return the n-th Fibonacci number.\"\"\"\n",
    "import json\n\n\ndef load_config(path):\n",
    "def is_prime(n):\n",
    "def flatten(nested):\n    \"\"\"Flatten a list of lists.\"\"\"\n",
    "class Counter(dict):\n    def most_common(self, n=None):\n",
    "def quote(s):\n    \"\"\"Return a shell-escaped version of the string *s*.\"\"\"\n",
    "def splitext(p):\n",
    "def dedent(text):\n",
)


def _source_files() -> list[Path]:
    stdlib = Path(sysconfig.get_paths()["stdlib"])
    try:
        return sorted(p for p in stdlib.glob("*.py") if p.stat().st_size > 2000)
    except OSError:
        return []


def _prompt_from(source: str, match: re.Match[str], input_len: int) -> str:
    end = match.end() + 1  # include the newline after the header
    start = max(0, end - input_len)
    if start > 0:
        # Start at a line boundary so the prompt reads like source code.
        nl = source.find("\n", start, end)
        if 0 <= nl < match.start():
            start = nl + 1
    return source[start:end]


def code_prompts(n: int, *, input_len: int, seed: int) -> list[str]:
    """`n` prompt texts (fewer if the stdlib yields fewer; callers cycle) of at most `input_len` bytes."""
    rng = random.Random(seed)
    files = _source_files()
    rng.shuffle(files)
    out: list[str] = []
    for path in files:
        if len(out) >= n:
            break
        try:
            source = path.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError):
            continue
        if not source.isascii():
            continue
        headers = list(_HEADER.finditer(source))
        if not headers:
            continue
        # A few functions per file keeps the set varied across modules.
        for match in rng.sample(headers, min(3, len(headers))):
            text = _prompt_from(source, match, max(16, input_len))
            out.append(text)
            if len(out) >= n:
                break
    if not out:
        out = list(_FALLBACK)
    return out
