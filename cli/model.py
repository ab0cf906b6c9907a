"""`specctl model PATH`: what a model directory's config.json implies for SGLang, torch-free.

Prints the architecture, the layer kinds, the ordered `state_types` SGLang registers for PD transfer
and the draft head the checkpoint ships (`--format json`: keys `architecture`, `layer_kinds`,
`state_types`, `draft`, plus `known`, `pool`, `num_layers`, `pd_unsupported`), as a function of the
flags that change the KV pool or add a draft pool (`--sglang-args "--kv-cache-dtype mxfp8
--disable-hybrid-swa-memory --speculative-algorithm EAGLE"`). `draft` is null, or an object with
`kind` (`mtp` for a built-in MTP/NextN head, `eagle` / `eagle3` / `gemma4_assistant` for a draft
checkpoint), `text` and, for an MTP head, `field`, `layers`, `draft_architecture` and
`draft_defaults_to_target` (SGLang fills `--speculative-draft-model-path` with the model path);
`mtp_draft_architecture` is what SGLang loads this architecture's MTP layers as (null: it has none).
Exit 0; 2 when config.json cannot be read or the flags are wrong.
"""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING, Annotated, Any, Optional

import typer

from specctl.cli.common import OutputFormat, handle_errors
from specctl.cli.main import app
from specctl.errors import UsageError

if TYPE_CHECKING:
    from specctl.schemas.sglang.families import SGLangModel


@app.command("model")
def model(
    path: Annotated[str, typer.Argument(help="A local model directory (holding config.json), its config.json, "
                                             "or builtin:NAME.", show_default=False)],
    sglang_args: Annotated[Optional[str], typer.Option(  # noqa: UP045 - Typer reads annotations at runtime
        "--sglang-args", metavar='"--kv-cache-dtype mxfp8 ..."',
        help="SGLang server flags that change the KV pool, as you would pass them (quoted as one string).",
        show_default=False)] = None,
    output: Annotated[OutputFormat, typer.Option("--format", help="Output format.")] = OutputFormat.text,
) -> None:
    """Show a model's architecture, layer kinds, SGLang's state_types and its draft head, from config.json alone.

    Example: specctl model /models/DeepSeek-V3.1 --sglang-args "--speculative-algorithm EAGLE"
    """
    with handle_errors():
        import json
        from collections import Counter
        from pathlib import Path

        from specctl.schemas.model_facts import BUILTIN_PREFIX, read_config_json, resolve_model_dir
        from specctl.schemas.sglang.command import SGLangCommand, ShellError, Word, parse_args, shell_words
        from specctl.schemas.sglang.families import FamilyError, mtp_draft_architecture, sglang_model

        p = resolve_model_dir(path) if path.startswith(BUILTIN_PREFIX) else Path(path).expanduser()
        cfg_path = p if p.name == "config.json" and not p.is_dir() else p / "config.json"
        cfg = read_config_json(cfg_path, label=path)
        cmd = SGLangCommand(name="--sglang-args")
        if sglang_args:
            try:
                groups = shell_words(sglang_args)
            except ShellError as exc:  # unbalanced quotes
                raise UsageError(f"--sglang-args: {exc}") from None
            words = [w for g in groups for w in g]
            parse_args(cmd, [Word("--model-path", 1, 1), Word(str(p), 1, 1), *words])
            errors = [f for f in cmd.findings if f.severity == "error"]
            if errors:
                raise UsageError(f"--sglang-args: {errors[0].message}", hint=errors[0].fix)
        try:
            m = sglang_model(cfg)
        except FamilyError as exc:
            raise UsageError(f"{path}: {exc}") from None
        algo = cmd.value("speculative_algorithm")
        states = m.state_types(kv_cache_dtype=str(cmd.value("kv_cache_dtype")),
                               disable_hybrid_swa_memory=bool(cmd.value("disable_hybrid_swa_memory")),
                               speculative_algorithm=algo if isinstance(algo, str) else None,
                               env=cmd.env)
        pool = m.effective_pool(disable_hybrid_swa_memory=bool(cmd.value("disable_hybrid_swa_memory")))
        draft = _draft(m)
        if output is OutputFormat.json:
            sys.stdout.write(json.dumps({
                "architecture": m.architecture, "layer_kinds": list(m.layer_kinds), "state_types": list(states),
                "draft": draft, "known": m.known, "pool": pool, "num_layers": len(m.layer_kinds),
                "pd_unsupported": m.pd_unsupported, "mtp_draft_architecture": mtp_draft_architecture(m.architecture),
            }, indent=2) + "\n")
            return
        counts = ", ".join(f"{k} x{n}" for k, n in Counter(m.layer_kinds).items())
        lines = [
            f"architecture  {m.architecture}" + ("" if m.known else "  (not known to specctl: taken as plain "
                                                 "attention, no state_types)"),
            f"layers        {len(m.layer_kinds)} ({counts})",
            f"layer kinds   {' '.join(m.layer_kinds)}",
            f"KV pool       {pool}",
            f"state_types   [{', '.join(states)}]" + ("" if states else "  (nothing besides paged KV is transferred)"),
            f"draft         {draft['text'] if draft else _no_draft(m)}",
        ]
        if m.pd_unsupported:
            lines.append(f"PD            not supported by SGLang: {m.pd_unsupported}")
        sys.stdout.write("\n".join(lines) + "\n")


def _draft(m: SGLangModel) -> dict[str, Any] | None:
    """The `draft` entry of `specctl model`: the checkpoint's own MTP head, or what kind of draft it is."""
    if m.mtp is not None:
        how = ("SGLang uses it when --speculative-draft-model-path is omitted" if m.mtp.draft_defaults_to_target
               else "pass --speculative-draft-model-path with this model's path to use it")
        return {"kind": "mtp", "field": m.mtp.field, "layers": m.mtp.layers,
                "draft_architecture": m.mtp.draft_architecture,
                "draft_defaults_to_target": m.mtp.draft_defaults_to_target,
                "text": f"{m.mtp.describe()} (loaded as {m.mtp.draft_architecture}; {how})"}
    if m.draft_kind is not None:
        algos = {"eagle": "EAGLE / NEXTN", "eagle3": "EAGLE3",
                 "gemma4_assistant": "EAGLE / NEXTN (SGLang runs it as FROZEN_KV_MTP)"}[m.draft_kind]
        name = m.draft_kind.replace("_", " ")
        return {"kind": m.draft_kind, "text": f"this checkpoint is an {name} draft (for {algos})"}
    return None


def _no_draft(m: SGLangModel) -> str:
    from specctl.schemas.sglang.families import mtp_draft_architecture

    arch = mtp_draft_architecture(m.architecture)
    if arch is None:
        return "none built in"
    return (f"none declared in config.json (SGLang loads this architecture's MTP layers as {arch} when the "
            "checkpoint has them and --speculative-draft-model-path names it)")
