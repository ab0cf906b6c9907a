"""Options shared by several commands, defined once: `--set KEY=VALUE` (repeatable) and `-c/--config`.

`validate`, `generate`, `serve`, `up` and `bench` take the same spelling, so a deployment loads the
same way everywhere: `load_deployment(config, overrides=set_values or ())`.
"""

from __future__ import annotations

from typing import Annotated, Optional

import typer

SetOption = Annotated[
    Optional[list[str]],  # noqa: UP045 - Typer reads this annotation at runtime on Python 3.10
    typer.Option(
        "--set",
        metavar="KEY=VALUE",
        help="Override a field of the deployment, helm-style (repeatable): --set speculative.num_steps=5 "
        "--set serve.graph_batch_sizes=[1,2,4]. VALUE is parsed as YAML.",
        show_default=False,
    ),
]

ConfigOption = Annotated[
    str,
    typer.Option(
        "-c",
        "--config",
        metavar="DEPLOY",
        help="Deployment file (YAML/JSON) or preset name (specctl presets list).",
    ),
]
