"""Rule 6, topology (TOP6xx): the processes of a deployment can all bind and find each other.

Hosts must be literal IP addresses or `localhost` (validate never resolves names); no two listeners
(HTTP ports and prefill's bootstrap port) may share an address; prefill needs a bootstrap port;
the shm transfer backend needs prefill and decode on one host; colocated excludes prefill/decode; the front door
(the router) is one that tells a client its stream was cut (TOP607, a warning for sglang-router).

Which listeners can collide is host-aware. The roles of one file form one topology that `specctl up`
starts on one machine, so overlapping bind addresses collide there (0.0.0.0 overlaps every IPv4 address).
Two files (a prefill file and a decode file, two SGLang commands, two pods of a manifest) are each started
on their own host: their listeners collide only when both name the same machine, that is the same literal
non-wildcard address or loopback on both sides; a wildcard bind names no machine, so such a pair is
"cannot check" (TOP606, info). A host written as an unexpanded shell variable (`${HOST}`) is "cannot
check" too, never an error.
"""

from __future__ import annotations

import functools
import ipaddress
from typing import Any

from specctl.schemas.catalog import RuleDoc, register
from specctl.schemas.findings import Finding
from specctl.schemas.loader import child_path
from specctl.schemas.rules import RoleRef, RuleContext, finding
from specctl.schemas.sglang.router import DEFAULT_ROUTER_KIND, router_shortfalls

register(RuleDoc(
    "TOP601", "port collision", "error",
    "Two listeners of the deployment (role HTTP ports, prefill's bootstrap port, the router's metrics port) "
    "use the same port on "
    "overlapping addresses (0.0.0.0 overlaps every IPv4 address; localhost is 127.0.0.1).",
    "OSError: [Errno 98] Address already in use, when the second process starts.",
    "Give every listener its own port.",
    "roles: {prefill: {port: 30001, bootstrap_port: 30001}}", "roles: {prefill: {port: 30001, bootstrap_port: 8998}}",
))
register(RuleDoc(
    "TOP602", "host is not a literal address", "error",
    "Hosts are literal IPv4/IPv6 addresses or localhost, so the topology can be checked (and bound) "
    "without name resolution.",
    "socket.gaierror: Name or service not known, or a bind to an unexpected interface.",
    "Write the IP address (e.g. 127.0.0.1 or 10.0.0.2), or localhost.",
    "roles: {decode: {host: gpu-node-2}}", "roles: {decode: {host: 10.0.0.2}}",
))
register(RuleDoc(
    "TOP603", "prefill without a bootstrap port", "error",
    "Decode registers with prefill's bootstrap endpoint (the handshake) before serving; prefill must declare it.",
    "Decode never pairs and never reports ready.",
    "Set roles.prefill.bootstrap_port (e.g. 8998).",
    "roles: {prefill: {port: 30001}}", "roles: {prefill: {port: 30001, bootstrap_port: 8998}}",
))
register(RuleDoc(
    "TOP604", "shm transfer across hosts", "error",
    "transfer.backend: shm uses shared memory, which exists only on one machine.",
    "Transfer fails: decode cannot open prefill's shared-memory segments.",
    "Put prefill and decode on one host, or use transfer.backend: zmq.",
    "transfer: {backend: shm}\nroles: {prefill: {host: 10.0.0.1}, decode: {host: 10.0.0.2}}",
    "transfer: {backend: zmq}",
))
register(RuleDoc(
    "TOP605", "colocated mixed with prefill/decode", "error",
    "A colocated engine does prefill and decode itself; declaring it next to prefill/decode roles is ambiguous.",
    "specctl up would start an engine nothing routes to.",
    "Declare either colocated (optionally with router) or prefill + decode (+ router).",
    "roles: {colocated: ..., prefill: ..., decode: ...}", "roles: {prefill: ..., decode: ...}",
))

register(RuleDoc(
    "TOP606", "listeners on hosts validate cannot compare", "info",
    "A listener's host is a wildcard bind (0.0.0.0, ::) in a file started on its own host, or an unexpanded shell "
    "variable: whether two listeners share a machine is decided where they are started, not in the files.",
    "OSError: [Errno 98] Address already in use, only if both processes do start on one machine.",
    "Nothing, if the processes run on different hosts or pods; else give each listener its own port.",
    "prefill.sh: --host 0.0.0.0 --port 30000 / decode.sh: --host 0.0.0.0 --port 30000",
    "prefill.sh: --host 10.0.0.1 --port 30000 / decode.sh: --host 10.0.0.2 --port 30000",
))

register(RuleDoc(
    "TOP607", "sglang-router as the front door", "warning",
    "roles.router.kind: sglang-router (0.3.2) ends a stream it cuts (a decode killed or stopped, a request past "
    "the router's request timeout) by closing the connection mid-stream, with neither an error event nor [DONE]; "
    "no flag of it changes that. It has no client timeouts either (idle, partial-header and partial-body "
    "connections stay open). smg sends an error event and [DONE] and closes slow clients.",
    "A client reads a cut answer as a complete, short one (or an IncompleteRead), and slow clients hold the "
    "router's connections indefinitely.",
    "Use smg: roles.router.kind: smg (the default).",
    "roles: {router: {host: 127.0.0.1, port: 30000, kind: sglang-router}}",
    "roles: {router: {host: 127.0.0.1, port: 30000, kind: smg}}",
))

_LOOPBACK = "loopback"
_UNEXPANDED = "unexpanded"


@functools.lru_cache(maxsize=4096)  # hosts repeat across the files of one run; ipaddress parsing is slow
def _host_key(host: str) -> tuple[str, Any]:
    """('any4'|'any6'|'loopback'|'ip', value) for overlap tests; None value for non-literal hosts."""
    if host == "localhost":
        return (_LOOPBACK, None)
    if "$" in host:  # `${HOST}`: the shell expands it where the command runs
        return (_UNEXPANDED, host)
    try:
        ip = ipaddress.ip_address(host)
    except ValueError:
        return ("name", host)
    if ip.is_unspecified:
        return ("any6" if ip.version == 6 else "any4", None)
    if ip.is_loopback:
        return ("ip", str(ip)) if str(ip) not in ("127.0.0.1",) else (_LOOPBACK, None)
    return ("ip", str(ip))


def _overlap(a: str, b: str) -> bool:
    """Whether two bind addresses on one machine overlap."""
    ka, kb = _host_key(a), _host_key(b)
    if "any6" in (ka[0], kb[0]):
        return True
    if "any4" in (ka[0], kb[0]):
        other = kb if ka[0] == "any4" else ka
        return other[0] != "ip" or ipaddress.ip_address(other[1]).version == 4
    return ka == kb


def _same_machine(a: str, b: str) -> bool | None:
    """Whether listeners of two separately started files share a machine: True for the same literal address
    or loopback on both sides, False for two different literal addresses, None when a side names no machine
    (a wildcard bind or an unexpanded variable)."""
    ka, kb = _host_key(a), _host_key(b)
    if {ka[0], kb[0]} & {"any4", "any6", _UNEXPANDED}:
        return None
    return ka == kb


def _same_host(a: str, b: str) -> bool:
    ka, kb = _host_key(a), _host_key(b)
    return ka == kb or {ka[0], kb[0]} <= {_LOOPBACK, "any4", "any6"}


def listeners(ctx: RuleContext) -> list[tuple[str, str, int, str]]:
    """(label, host, port, path) of every listener the file declares."""
    roles = ctx.data.get("roles")
    out: list[tuple[str, str, int, str]] = []
    if not isinstance(roles, dict):
        return [("colocated port", "127.0.0.1", 30000, "$")]
    for role, rcfg, label, base in _instances(roles):
        host = rcfg.get("host", "127.0.0.1")
        if not isinstance(host, str):  # a schema error reports it; no collision check on garbage
            continue
        if isinstance(rcfg.get("port"), int):
            out.append((f"{label}.port", host, rcfg["port"], f"{base}.port"))
        if role == "prefill" and isinstance(rcfg.get("bootstrap_port"), int):
            out.append((f"{label}.bootstrap_port", host, rcfg["bootstrap_port"], f"{base}.bootstrap_port"))
        if role == "router" and isinstance(rcfg.get("metrics_port"), int):
            out.append((f"{label}.metrics_port", host, rcfg["metrics_port"], f"{base}.metrics_port"))
    return out


def _instances(roles: dict[str, Any]) -> list[tuple[str, dict[str, Any], str, str]]:
    """(role, config, label, JSON path) of every role instance (prefill and decode may be lists)."""
    out = []
    for role, rcfg in roles.items():
        items = list(enumerate(rcfg)) if isinstance(rcfg, list) else [(None, rcfg)]
        for i, item in items:
            if isinstance(item, dict):
                base = child_path("$.roles", role) + ("" if i is None else f"[{i}]")
                out.append((role, item, role if i is None else f"{role}[{i}]", base))
    return out


def _collisions(a: list[tuple[str, str, int, str]], b: list[tuple[str, str, int, str]], same: bool,
                other_name: str = "") -> list[Finding]:
    """TOP601 for listeners that bind one port on one machine. `same`: `a` and `b` are one file's listeners
    (one machine); else two files started on their own hosts (see the module docstring)."""
    out: list[Finding] = []
    for j, (lb, hb, pb, pathb) in enumerate(b):
        for i, (la, ha, pa, _) in enumerate(a):
            if same and i >= j:
                break
            if pa != pb:
                continue
            if _UNEXPANDED in (_host_key(ha)[0], _host_key(hb)[0]):
                shared: bool | None = None
            else:
                shared = _overlap(ha, hb) if same else _same_machine(ha, hb)
            where = f" in {other_name}" if other_name else ""
            if shared:
                out.append(finding(
                    "TOP601", "error", pathb,
                    f"{lb} {hb}:{pb} collides with {la} {ha}:{pa}{where}",
                    f"give {lb} its own port (e.g. {pb + 1 if pb < 65535 else pb - 1})",
                ))
            elif shared is None:
                out.append(finding(
                    "TOP606", "info", pathb,
                    f"{lb} {hb}:{pb} and {la} {ha}:{pa}{where} use one port; whether they share a machine is "
                    "decided where they start (a wildcard bind or an unexpanded variable names no host)",
                    f"nothing if they run on different hosts or pods; else give {lb} its own port",
                ))
    return out


def check(ctx: RuleContext) -> list[Finding]:
    if not ctx.topology_clean:
        return []
    out: list[Finding] = []
    roles = ctx.section("roles")
    for _role, rcfg, label, base in _instances(roles):
        if not isinstance(rcfg.get("host"), str):
            continue
        if _host_key(rcfg["host"])[0] == "name":  # an unexpanded `${VAR}` is not a name: TOP606 covers it
            out.append(finding(
                "TOP602", "error", f"{base}.host",
                f"roles.{label}.host {rcfg['host']!r} is not a literal IP address or localhost",
                "write the host's IP address (e.g. 10.0.0.2), or localhost / 127.0.0.1",
            ))
    out.extend(_collisions(listeners(ctx), listeners(ctx), same=True))
    for role, rcfg, label, base in _instances(roles):
        if role == "prefill" and "bootstrap_port" not in rcfg:
            out.append(finding(
                "TOP603", "error", base,
                f"roles.{label} has no bootstrap_port; decode cannot register with prefill (handshake)",
                f"add bootstrap_port to roles.{label} (e.g. bootstrap_port: 8998)",
            ))
    if "colocated" in roles and ({"prefill", "decode"} & set(roles)):
        out.append(finding(
            "TOP605", "error", "$.roles.colocated",
            f"roles declare colocated together with {', '.join(sorted({'prefill', 'decode'} & set(roles)))}",
            "declare either colocated (optionally with router) or prefill + decode (+ router)",
        ))
    if "prefill" in ctx.roles and "decode" in ctx.roles and ctx.clean("prefill", "transfer") \
            and ctx.clean("decode", "transfer"):
        out.extend(_shm(RoleRef(ctx, "prefill"), RoleRef(ctx, "decode")))
    router = roles.get("router")
    shortfalls = router_shortfalls(str(router.get("kind") or DEFAULT_ROUTER_KIND)) if isinstance(router, dict) \
        else None
    if shortfalls:
        out.append(finding("TOP607", "warning", "$.roles.router.kind", shortfalls,
                           "use smg: roles.router.kind: smg (the default), or remove the kind"))
    return out


def _shm(p: RoleRef, d: RoleRef) -> list[Finding]:
    if "shm" not in (p.cfg["transfer"].get("backend"), d.cfg["transfer"].get("backend")):
        return []
    if _same_host(p.cfg["host"], d.cfg["host"]) or _UNEXPANDED in (_host_key(p.cfg["host"])[0],
                                                                    _host_key(d.cfg["host"])[0]):
        return []
    return [finding(
        "TOP604", "error", d.path("transfer", "backend"),
        f"transfer.backend shm needs one host, but prefill is on {p.cfg['host']} and decode on {d.cfg['host']}",
        "use transfer.backend: zmq, or run prefill and decode on one host",
    )]


def check_pair(p: RoleRef, d: RoleRef) -> list[Finding]:
    """Cross-file topology of a prefill file and a decode file: collisions and shm across hosts."""
    if not (p.ctx.topology_clean and d.ctx.topology_clean):
        return []
    return _collisions(listeners(p.ctx), listeners(d.ctx), same=False, other_name=p.ctx.name) + _shm(p, d)
