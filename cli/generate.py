"""`specctl generate`: run one prompt through a deployment's engine offline (no server).

Thin wrapper: load the deployment (with `--set` overrides), build `EngineConfig` from one role,
`Engine.generate()` one prompt, render. torch is imported only inside the command, so
`specctl --help` and `specctl validate` stay fast. Exit codes: 0 ok; 1 invalid deployment or
sampling options; 2 unreadable deployment; 3 engine failure (including a request that finished with
an error — its JSON is still printed with `--format json`).
"""

from __future__ import annotations

import json
from typing import Annotated, Any, Optional

import typer

from specctl.cli.common import OutputFormat, handle_errors, stderr_console, stdout_console
from specctl.cli.main import app
from specctl.cli.options import ConfigOption, SetOption
from specctl.errors import RuntimeFailure, UsageError

# Role whose engine `generate` runs when --role is not given: the first one the deployment declares.
ROLE_PREFERENCE = ("colocated", "decode", "prefill")


@app.command()
def generate(
    config: ConfigOption,
    prompt: Annotated[str, typer.Option("--prompt", help="Prompt text to continue.")],
    set_: SetOption = None,
    max_tokens: Annotated[int, typer.Option("--max-tokens", help="Largest number of new tokens.")] = 128,
    temperature: Annotated[float, typer.Option("--temperature", help="0 = greedy.")] = 0.0,
    top_k: Annotated[int, typer.Option("--top-k", help="Sample from the k most likely tokens (0 = all).")] = 0,
    top_p: Annotated[float, typer.Option("--top-p", help="Nucleus sampling mass (1 = off).")] = 1.0,
    seed: Annotated[Optional[int], typer.Option("--seed", help="Seed of this request's random stream.")] = None,  # noqa: UP045
    stop: Annotated[Optional[list[str]], typer.Option("--stop", help="Stop string (repeatable).")] = None,  # noqa: UP045
    ignore_eos: Annotated[bool, typer.Option("--ignore-eos", help="Keep generating past EOS.")] = False,
    role: Annotated[
        Optional[str],  # noqa: UP045 - Typer reads these annotations at runtime on Python 3.10
        typer.Option("--role", help="Which role's engine config to use (default: colocated, else decode)."),
    ] = None,
    fmt: Annotated[OutputFormat, typer.Option("--format", help="Output format.")] = OutputFormat.text,
) -> None:
    """Generate a continuation of --prompt with the deployment's engine (offline, no server)."""
    with handle_errors():
        from specctl.engine.install import require_engine

        require_engine("specctl generate")
        result = run_generate(
            config,
            overrides=tuple(set_ or ()),
            role=role,
            prompt=prompt,
            sampling=dict(
                max_tokens=max_tokens,
                temperature=temperature,
                top_k=top_k,
                top_p=top_p,
                seed=seed,
                stop=tuple(stop or ()),
                ignore_eos=ignore_eos,
            ),
        )
        if fmt is OutputFormat.json:
            typer.echo(json.dumps(result))
        elif result["finish_reason"] != "error":
            _render_text(result)
        if result["finish_reason"] == "error":
            raise RuntimeFailure(f"generation failed: {result['error']}")


def run_generate(
    source: str, *, overrides: tuple[str, ...], role: str | None, prompt: str, sampling: dict[str, Any]
) -> dict[str, Any]:
    """Load the deployment, run the engine on one prompt, return the JSON-ready result."""
    from specctl.engine.config import EngineConfig
    from specctl.engine.engine import Engine
    from specctl.engine.sampling_params import SamplingParams
    from specctl.schemas.deployment import load_deployment

    params = SamplingParams(**sampling)  # InvalidInput (exit 1) on bad values, before loading a model
    deployment = load_deployment(source, overrides=overrides)
    engine_roles = [r for r in ROLE_PREFERENCE if r in deployment.roles]
    role = role or (engine_roles[0] if engine_roles else None)
    if role not in engine_roles:
        what = f"has no engine role {role!r}" if role else "declares no engine role"
        raise UsageError(
            f"deployment {deployment.name!r} {what}",
            hint=f"engine roles declared: {', '.join(engine_roles) or 'none'} (a router runs no model)",
        )
    config = EngineConfig.from_role(deployment.role(role))
    engine = Engine(config)
    res = engine.generate([prompt], params)[0]
    out = {
        "deployment": deployment.name,
        "role": role,
        "model": config.model_ref,
        "device": str(engine.runner.device),
        "prompt": prompt,
        **res.to_json(),
    }
    stats = engine.stats()
    if "speculative" in stats:
        out["speculative_engine"] = stats["speculative"]
    return out


def _render_text(result: dict[str, Any]) -> None:
    out = stdout_console()
    # The prompt is shown dimmed (on a terminal) so the continuation reads in place.
    out.print(result["prompt"], style="dim", end="", markup=False, highlight=False)
    out.print(result["text"], markup=False, highlight=False)
    out.file.flush()  # the result before the diagnostics line, also when stdout is a pipe
    t = result["timing"]
    err = stderr_console()
    parts = [
        f"{result['num_output_tokens']} tokens",
        f"finish={result['finish_reason']}",
        f"ttft={_fmt_s(t.get('ttft_s'))}",
        f"total={_fmt_s(t.get('total_s'))}",
    ]
    if t.get("tokens_per_s"):
        parts.append(f"{t['tokens_per_s']:.1f} tok/s")
    spec = result.get("speculative") or {}
    if spec:
        parts.append(f"accepted/step={spec['mean_accepted']:.2f} over {spec['verify_steps']} verify steps")
    err.print(f"{result['model']} on {result['device']}: {', '.join(parts)}", style="dim", highlight=False)


def _fmt_s(value: float | None) -> str:
    return "-" if value is None else f"{value:.3f}s"
