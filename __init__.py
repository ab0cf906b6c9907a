"""specctl: validate, launch and benchmark speculative + disaggregated LLM deployments.

The repository root is the `specctl` import package (see pyproject's package-dir): `specctl.schemas`
(what a deployment is; torch-free), `specctl.engine` (the runtime), `specctl.cli` (thin commands),
`specctl.presets` (named deployments as data).
"""

from __future__ import annotations

__version__ = "0.1.0"
