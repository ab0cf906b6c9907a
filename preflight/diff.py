"""Drift (server vs deployment): one field a running server resolved differently from its deployment.

`compare_with_deployment` returns a `Drift` for every field a deployment pins that the running server
resolved differently (SGLang resolves some values itself: page size, `max_running_requests`, draft
tokens under adaptive). The pair's own diff (prefill vs decode) is `specctl.schemas.server_facts.
compare_pair`, over the agreement table. Each fix names the SGLang flag and the deployment key, since
either engine may be behind the URL.
"""

from __future__ import annotations

from dataclasses import dataclass

from specctl.schemas.server_facts import MODEL_PATH_FIELDS, ServerFacts, fix_text, same_model

_SPECCTL_BACKENDS = frozenset({"zmq", "shm"})


@dataclass(frozen=True)
class Drift:
    """One field a running server resolved differently from what the deployment asked for."""

    role: str
    field: str
    asked: object
    running: object
    fix: str

    def to_json(self) -> dict[str, object]:
        return {"role": self.role, "field": self.field, "asked": _plain(self.asked),
                "running": _plain(self.running), "fix": self.fix}


def _plain(value: object) -> object:
    return list(value) if isinstance(value, tuple) else value


# Fields a deployment role pins; compared with what each running server resolved.
DEPLOYMENT_FIELDS = (
    "model_path", "dtype", "page_size", "transfer_backend", "speculative_algorithm", "draft_model",
    "num_steps", "num_draft_tokens", "adaptive", "state_types", "max_running_requests",
)


def compare_with_deployment(role: str, running: ServerFacts, asked: ServerFacts) -> list[Drift]:
    """Every field the deployment pins for `role` that the running server resolved differently."""
    rows: list[Drift] = []
    for name in DEPLOYMENT_FIELDS:
        want, got = asked.value(name), running.value(name)
        if want is None or want == got:
            continue
        if name in MODEL_PATH_FIELDS and isinstance(want, str) and isinstance(got, str) and same_model(want, got):
            continue
        if name == "state_types" and got is None:
            continue  # the server cannot say; the pair check covers what both report
        if name == "transfer_backend" and running.engine == "sglang" and want in _SPECCTL_BACKENDS:
            continue  # specctl's own backends; an SGLang server runs the one the export chose for it
        rows.append(Drift(role, name, want, got,
                          fix_text(name, f"restart the {role} server with the deployment's value, or change "
                                     "the deployment to what the server resolved")))
    return rows
