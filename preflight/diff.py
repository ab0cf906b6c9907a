"""Difference (prefill vs decode) and Drift (server vs deployment): one disagreeing field each, with the fix.

`compare_pair(prefill, decode)` returns a row for every agreement-table field (`PAIR_FIELDS`) that
differs (all of them, not the first), plus a row when a server answers in the wrong PD role.
`compare_with_deployment` returns a `Drift` for every field a deployment pins that the running server
resolved differently (SGLang resolves some values itself: page size, `max_running_requests`, draft
tokens under adaptive). Fix texts and the "SGLang fails at" details are the table's
(`specctl.schemas.pd_agreement`); each names the SGLang flag and the deployment key, since either
engine may be behind the URL.
"""

from __future__ import annotations

from dataclasses import dataclass

from specctl.preflight.facts import ServerFacts
from specctl.schemas.pd_agreement import Agreement, Difference, agreement, compare_values

# Fields compared only when both sides report them (SGLang skips its own check on None).
_WHEN_BOTH_KNOWN = frozenset({"kv_layout", "decode_allocation_policy", "state_types", "version"})
# Model references compared as directories (`builtin:tiny-hybrid` is its package directory).
_PATHS = frozenset({"model_path", "draft_model"})
_SPECCTL_BACKENDS = frozenset({"zmq", "shm"})
# Where the fields outside the agreement table are set, for their fixes.
_WHERE = {"max_running_requests": "deployment: serve.max_batch_size; SGLang: --max-running-requests",
          "role": "deployment: roles; SGLang: --disaggregation-mode"}


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


def _fix(name: str, what: str) -> str:
    where = _WHERE[name] if name in _WHERE else agreement(name).where()
    return f"{what} ({where})" if where else what


def compare_pair(prefill: ServerFacts, decode: ServerFacts) -> list[Difference]:
    """Every field on which prefill and decode disagree, in the agreement table's order."""
    rows: list[Difference] = []
    for side, facts, wrong in (("prefill", prefill, "decode"), ("decode", decode, "prefill")):
        if facts.role == wrong:
            rows.append(Difference(
                field="role", prefill=prefill.role, decode=decode.role,
                fix=_fix("role", f"point --{side} at a server started with --disaggregation-mode {side}"),
                detail=f"{facts.url} is a {wrong} server"))

    def excused(a: Agreement, p: object, d: object) -> bool:
        if a.name in _WHEN_BOTH_KNOWN and (p is None or d is None):
            return True
        return a.name in _PATHS and isinstance(p, str) and isinstance(d, str) and _same_model(p, d)

    rows += compare_values(lambda a, key: (prefill.value(key), decode.value(key)), lambda a: a.server_info,
                           skip=excused)
    return rows


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
        if name in _PATHS and isinstance(want, str) and isinstance(got, str) and _same_model(want, got):
            continue
        if name == "state_types" and got is None:
            continue  # the server cannot say; the pair check covers what both report
        if name == "transfer_backend" and running.engine == "sglang" and want in _SPECCTL_BACKENDS:
            continue  # specctl's own backends; an SGLang server runs the one the export chose for it
        rows.append(Drift(role, name, want, got,
                          _fix(name, f"restart the {role} server with the deployment's value, or change "
                                     "the deployment to what the server resolved")))
    return rows


def _same_model(want: str, got: str) -> bool:
    """The same model directory, spelled differently (a `builtin:` name, `~`, a relative path)."""
    from specctl.errors import SpecctlError
    from specctl.schemas.model_facts import resolve_model_dir

    try:
        return resolve_model_dir(want).resolve() == resolve_model_dir(got).resolve()
    except (OSError, SpecctlError):
        return False
