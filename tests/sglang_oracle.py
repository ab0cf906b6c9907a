"""SGLang's own parser as a test oracle, run in a child process (the test process never imports sglang).

Reads one JSON request list on stdin, writes one JSON answer list on stdout. Requests:
- {"op": "parse", "argv": [...], "abbrev": false}: `ServerArgs.add_cli_args` on a parser with
  `allow_abbrev` as given (SGLang's launch_server uses the argparse default, True), `--config` merged
  by `ConfigArgumentMerger` as `prepare_server_args` does, `parse_args`, then `ServerArgs.from_cli_args`;
  answer {"ok": bool, "error": str, "values": {dest: value}}.
- {"op": "adaptive_reason", "argv": [...]}: `adaptive_unsupported_reason(ServerArgs)` (SGLang's list of
  silent adaptive downgrades); answer {"ok": bool, "reason": str | null}.
- {"op": "adaptive_init", "argv": [...]}: what SGLang resolves for adaptive speculation on CPU: the
  downgrade reason, then (when none) `speculative_hook._init_adaptive_speculative_params`; answer
  {"ok": bool, "reason", "error", "num_draft_tokens", "num_steps", "adaptive"}.
- {"op": "graph_sizes", "argv": [...], "max_bs": N}: SGLang's decode CUDA-graph batch sizes up to N
  (`cuda_graph_hook.generate_decode_cuda_graph_batch_sizes`); answer {"ok": true, "sizes": [...]}.
- {"op": "table"}: answer {"ok": true, "table": build_table()} (scripts/gen_sglang_flags.py).
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import os
import sys
from pathlib import Path
from typing import Any

os.environ["HF_HUB_OFFLINE"] = "1"
os.environ["TRANSFORMERS_OFFLINE"] = "1"
sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "scripts"))

from gen_sglang_flags import build_table, install_triton_stub, sglang_parser  # noqa: E402


class _ParseError(Exception):
    pass


def _parser(abbrev: bool) -> argparse.ArgumentParser:
    from sglang.srt.server_args import ServerArgs

    class P(argparse.ArgumentParser):
        def error(self, message: str) -> Any:  # argparse would print and exit(2)
            raise _ParseError(message)

    p = P(allow_abbrev=abbrev)
    ServerArgs.add_cli_args(p)
    return p


def _adaptive_init(sa: Any, unsupported: Any) -> dict[str, Any]:
    from sglang.srt.arg_groups import speculative_hook
    from sglang.srt.arg_groups.model_override_base import resolving_view

    reason = unsupported(sa) if sa.speculative_adaptive else None
    error = None
    if sa.speculative_adaptive and reason is None:
        try:
            speculative_hook._init_adaptive_speculative_params(sa)
        except ValueError as exc:
            error = str(exc)
    view = resolving_view(sa)
    return {"ok": True, "reason": reason, "error": error, "adaptive": bool(sa.speculative_adaptive),
            "num_draft_tokens": view.speculative_num_draft_tokens, "num_steps": view.speculative_num_steps}


def main() -> int:
    install_triton_stub()
    with contextlib.redirect_stdout(io.StringIO()):
        sglang_parser()  # imports sglang once (its import logs to stdout/stderr)
    from sglang.srt.server_args import ServerArgs
    from sglang.srt.speculative.adaptive_spec_params import adaptive_unsupported_reason

    parsers = {True: _parser(True), False: _parser(False)}
    out: list[dict[str, Any]] = []
    for req in json.loads(sys.stdin.read()):
        op = req["op"]
        try:
            if op == "table":
                out.append({"ok": True, "table": build_table()})
                continue
            parser = parsers[bool(req.get("abbrev", False))]
            argv = req["argv"]
            if "--config" in argv:  # as prepare_server_args does
                from sglang.srt.utils.server_args_config_parser import ConfigArgumentMerger

                argv = ConfigArgumentMerger(parser).merge_config_with_args(argv)
            ns = parser.parse_args(argv)
            sa = ServerArgs.from_cli_args(ns)
            if op == "graph_sizes":
                from sglang.srt.arg_groups.cuda_graph_hook import generate_decode_cuda_graph_batch_sizes

                out.append({"ok": True, "sizes": generate_decode_cuda_graph_batch_sizes(sa, int(req["max_bs"]))})
                continue
            if op == "adaptive_init":
                out.append(_adaptive_init(sa, adaptive_unsupported_reason))
                continue
            if op == "parse":
                vals = {k: v for k, v in vars(ns).items() if isinstance(v, (int, float, str, bool, list, type(None)))}
                out.append({"ok": True, "error": "", "values": vals})
            else:
                out.append({"ok": True, "reason": adaptive_unsupported_reason(sa)})
        except (_ParseError, ValueError) as exc:  # ValueError: ConfigArgumentMerger's refusals
            out.append({"ok": False, "error": str(exc)})
        except SystemExit as exc:
            out.append({"ok": False, "error": f"exit {exc.code}"})
    sys.stdout.write(json.dumps(out, default=str))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
