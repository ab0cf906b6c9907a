"""The server under test: a URL given by the user, or a deployment launched for the bench.

`launched(source, overrides)` validates the deployment file (or preset), launches it through the
engine's launcher -- `specctl.engine.serve.launcher.launch(deployment, status_callback=...)` when the
engine provides it, else the process `Launcher` that `specctl up` drives -- waits until every role
is paired and ready, yields the router URL with the provenance the records carry (resolved config,
handshake fingerprint, and the URLs of the engine processes behind the router, which the bench's
snapshots read: the router has no engine `/server_info` or `/metrics`), and tears the deployment
down on exit -- also on Ctrl-C or an error.
Both imports are lazy: `--url` benches never load the schemas or the engine.
"""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Callable, Iterator, Sequence
from typing import Any

from specctl.bench import server_info as si
from specctl.bench.probe import merge_server_info
from specctl.bench.runner import Provenance
from specctl.errors import RuntimeFailure


@dataclasses.dataclass(frozen=True)
class Target:
    url: str
    provenance: Provenance = Provenance()


READY_TIMEOUT_S = 600.0


@contextlib.contextmanager
def launched(source: str, overrides: Sequence[str] = (), *,
             status_callback: Callable[[Any], None] | None = None) -> Iterator[Target]:
    try:
        from specctl.schemas.deployment import load_deployment
    except ImportError as exc:
        raise RuntimeFailure(f"deployment loading is not available in this build: {exc}",
                             hint="bench a running server with --url instead") from None
    deployment = load_deployment(source, overrides=overrides)
    with _launch(deployment, overrides, status_callback) as (url, info, roles):
        if roles:  # behind a router: the decodes' own registration fingerprint
            info = merge_server_info({name: _get_info(role_url) for name, role_url in roles})
        yield Target(url=url, provenance=Provenance(
            deployment={"name": getattr(deployment, "name", None), "path": getattr(deployment, "path", None),
                        "config": getattr(deployment, "raw", None)},
            fingerprint=si.fingerprint(info), preflight=preflight_of(deployment), roles=roles))


def preflight_of(deployment: Any) -> dict[str, Any] | None:
    """The live preflight of a launched deployment's prefill and decode (None without a PD pair, or
    when a server cannot be read: provenance, never a precondition -- the launcher's handshake gates)."""
    from specctl.errors import SpecctlError
    from specctl.preflight.check import pair_urls_of, run_preflight

    roles = getattr(deployment, "roles", ())
    if "prefill" not in roles or "decode" not in roles:
        return None
    try:
        prefill_url, decode_url, _ = pair_urls_of(deployment)  # 0.0.0.0 / IPv6 hosts handled there
        report = run_preflight(prefill_url, decode_url, timeout_s=10)
    except (SpecctlError, KeyError, TypeError):
        return None
    return {"ok": report.ok, **report.fingerprints()}


@contextlib.contextmanager
def _launch(deployment: Any, overrides: Sequence[str],
            status_callback: Callable[[Any], None] | None) -> Iterator[tuple[str, Any, tuple[tuple[str, str], ...]]]:
    """(router URL, its /server_info or None, the engine roles behind a router as (name, URL)) while the
    deployment runs; torn down on exit."""
    try:
        from specctl.engine.serve import launcher as launcher_mod
    except ImportError as exc:
        raise RuntimeFailure(f"the deployment launcher is not available in this build: {exc}",
                             hint="start the deployment with `specctl up` and bench it with --url") from None
    launch = getattr(launcher_mod, "launch", None)
    if launch is not None:
        with launch(deployment, status_callback=status_callback) as handle:
            info: Any = None
            with contextlib.suppress(Exception):
                # Best effort: the fingerprint is provenance, not a precondition (the launcher already
                # refused to report ready on a failed handshake).
                info = handle.server_info()
            yield str(handle.url), info, ()
        return
    launcher_cls = getattr(launcher_mod, "Launcher", None)
    if launcher_cls is None:
        raise RuntimeFailure("the deployment launcher is not available in this build",
                             hint="start the deployment with `specctl up` and bench it with --url")
    # The process-level launcher (the one `specctl up` drives): start, wait until every role is
    # paired and ready, and stop everything on the way out (errors and Ctrl-C included).
    launcher = launcher_cls(deployment, overrides=tuple(overrides))
    with launcher:
        launcher.wait_ready(READY_TIMEOUT_S, on_status=status_callback)
        yield str(launcher.url), _get_info(str(launcher.url)), engine_roles(launcher)


def engine_roles(launcher: Any) -> tuple[tuple[str, str], ...]:
    """(instance name, URL) of every engine process behind the launcher's router; () without a router
    (a colocated server is itself the URL under load)."""
    status = getattr(launcher, "status", None)
    if "router" not in getattr(launcher, "roles", ()) or not isinstance(status, dict):
        return ()
    return tuple((str(name), str(st.url)) for name, st in status.items() if name.partition(".")[0] != "router")


def _get_info(url: str) -> dict[str, Any] | None:
    """The server's /server_info, or None when it did not answer one (the launcher's `_get_json`: no server,
    an error status, or an answer that is not HTTP or not a JSON object)."""
    from specctl.engine.serve.launcher import _get_json

    body, code = _get_json(url.rstrip("/") + "/server_info", timeout=5)
    return body if code == 200 and body else None
