"""run_preflight: read both servers, compare them (and each with the deployment), return a PreflightReport.

The report is `ok` only without a single difference; `specctl preflight` exits 3 otherwise and
`specctl up` never starts the router. Prefill's bootstrap `/route` is read when prefill speaks
SGLang's bootstrap protocol: always with an explicit `bootstrap_port`, else on a prefill-mode
server in SGLang's shape (its `disaggregation_bootstrap_port`). Today's specctl prefill pairs
through its own ZeroMQ handshake (which verifies the same facts before decode is ready), so its
bootstrap is not an HTTP server and is not asked.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from specctl.errors import RuntimeFailure, UsageError
from specctl.preflight.diff import Drift, compare_with_deployment
from specctl.preflight.reader import ServerReader
from specctl.schemas.pd_agreement import Difference
from specctl.schemas.role_config import RoleConfig
from specctl.schemas.server_facts import ServerFacts, compare_pair, expected_facts, normalise

if TYPE_CHECKING:
    from specctl.schemas.deployment import Deployment


@dataclass(frozen=True)
class PreflightReport:
    prefill: ServerFacts
    decode: ServerFacts
    differences: tuple[Difference, ...]
    drifts: tuple[Drift, ...] = ()
    route: Mapping[str, object] | None = None
    notes: tuple[str, ...] = field(default=())

    @property
    def ok(self) -> bool:
        return not self.differences and not self.drifts

    def fingerprints(self) -> dict[str, str]:
        """The preflight fingerprint of both roles (bench records bind these)."""
        return {"prefill": self.prefill.fingerprint(), "decode": self.decode.fingerprint()}

    def to_json(self) -> dict[str, object]:
        return {"ok": self.ok, "fingerprints": self.fingerprints(),
                "differences": [d.to_json() for d in self.differences],
                "deployment_differences": [d.to_json() for d in self.drifts],
                "prefill": self.prefill.to_json(), "decode": self.decode.to_json(),
                "bootstrap_route": dict(self.route) if self.route is not None else None,
                "notes": list(self.notes)}


def read_facts(reader: ServerReader, *, route: Mapping[str, object] | None = None) -> ServerFacts:
    info = reader.server_info()
    model_info = reader.model_info()
    try:
        return normalise(reader.url, info, model_info, route)
    except ValueError as exc:
        raise RuntimeFailure(f"{reader.who} {reader.url}: {exc}",
                             hint="preflight reads SGLang's or specctl's /server_info; is this an engine server?") \
            from None


def run_preflight(prefill_url: str, decode_url: str, *, bootstrap_port: int | None = None,
                  deployment_roles: Mapping[str, RoleConfig] | None = None,
                  timeout_s: float = 30.0, request_timeout_s: float = 5.0) -> PreflightReport:
    """Read prefill and decode, compare; `deployment_roles` maps "prefill"/"decode" to
    `Deployment.role(name)` configs to compare each server with. RuntimeFailure when a server cannot
    be read (down, not HTTP, non-JSON, bootstrap still 503 at `timeout_s`)."""
    p_reader = ServerReader("prefill", prefill_url, request_timeout_s=request_timeout_s)
    d_reader = ServerReader("decode", decode_url, request_timeout_s=request_timeout_s)
    notes: list[str] = []
    prefill = read_facts(p_reader)
    route = None
    port = bootstrap_port
    if port is None and prefill.shape == "sglang" and prefill.role == "prefill":
        port = prefill.bootstrap_port
    if port is not None:
        route = p_reader.bootstrap_route(port, timeout_s=timeout_s)
        prefill = read_facts(p_reader, route=route)  # the bootstrap's values are what decode will see
    elif prefill.role == "prefill":
        notes.append("prefill's bootstrap speaks specctl's handshake (verified by decode before it is ready); "
                     "/route not read")
    decode = read_facts(d_reader)
    for facts in (prefill, decode):
        if facts.role == "colocated":
            notes.append(f"{facts.url} is a colocated server (not started in a PD role)")
        notes.extend(f"{facts.url}: {n}" for n in facts.notes)
    differences = compare_pair(prefill, decode)
    drifts: list[Drift] = []
    for role, facts in (("prefill", prefill), ("decode", decode)):
        asked = (deployment_roles or {}).get(role)
        if asked is not None:
            drifts.extend(compare_with_deployment(role, facts, expected_facts(asked.to_json())))
    return PreflightReport(prefill, decode, tuple(differences), tuple(drifts), route, tuple(notes))


def deployment_roles_of(deployment: Deployment) -> dict[str, RoleConfig]:
    """{"prefill": role config, "decode": role config} of a loaded `Deployment` (colocated stands in for
    a role the deployment does not declare, so one colocated file can check both servers)."""
    roles = deployment.roles
    out: dict[str, RoleConfig] = {}
    for name in ("prefill", "decode"):
        source = name if name in roles else ("colocated" if "colocated" in roles else None)
        if source is not None:
            out[name] = deployment.role(source)
    return out


def pair_urls_of(deployment: Deployment) -> tuple[str, str, int | None]:
    """(prefill URL, decode URL, bootstrap port or None) of a deployment's roles, for `specctl preflight
    -c DEPLOY` without URLs. The bootstrap port is SGLang's HTTP bootstrap only with `engine: sglang`
    (the builtin engine's bootstrap is its ZeroMQ handshake). A role bound to every interface
    (`0.0.0.0`, `::`) is reached on loopback."""
    missing = [r for r in ("prefill", "decode") if r not in deployment.roles]
    if missing:
        raise UsageError(f"deployment {deployment.name!r} declares no {' or '.join(missing)} role",
                         hint="give --prefill URL --decode URL, or a deployment with prefill and decode roles")
    urls = []
    for name in ("prefill", "decode"):
        role = deployment.role(name)
        host, port = role.host, role.port
        if port is None:
            raise UsageError(f"deployment {deployment.name!r}: roles.{name} has no port",
                             hint=f"set roles.{name}.port, or give --{name} URL")
        host = "127.0.0.1" if host in (None, "0.0.0.0", "::", "") else str(host)
        urls.append(f"http://[{host}]:{port}" if ":" in host else f"http://{host}:{port}")
    boot = deployment.role("prefill").bootstrap_port
    bootstrap = boot if deployment.engine == "sglang" else None
    return urls[0], urls[1], bootstrap
