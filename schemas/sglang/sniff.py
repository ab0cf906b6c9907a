"""Is a file an SGLang launch command or a YAML/JSON document? Decided from its text, cheaply.

`validate` asks this of every input file, so it imports nothing beyond `re` (the command reader and
its flag table load only when a command is found).
"""

from __future__ import annotations

import re

_YAMLISH = re.compile(r"^\s*(?:[\"']?[\w.$-]+[\"']?\s*:(?:\s|$)|[{\[]|-\s)")


def looks_like_command(text: str) -> bool:
    """True when the text is a shell command (a launch script), not a YAML/JSON document: the first line
    that is not blank or a comment is a shebang, or is not YAML-shaped (`key:`, `- item`, `{`, `[`, `---`)
    while the text mentions sglang, a `--flag` or a `\\` continuation."""
    for raw in text.splitlines():
        s = raw.strip()
        if not s:
            continue
        if s.startswith("#!"):
            return True
        if s.startswith("#"):
            continue
        if s.startswith("---") or _YAMLISH.match(s):
            return False
        return "sglang" in text or " --" in text or s.endswith("\\")
    return False
