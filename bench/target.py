"""The server under test: a URL given by the user, or a deployment launched for the bench.

`launched(source, overrides)` validates the deployment file (or preset), launches it through the
process `Launcher` that `specctl up` drives, waits until every role is paired and ready, yields the
router URL with the provenance the records carry (resolved config, handshake fingerprint, and the URLs
of the engine processes behind the router, which the bench's snapshots read: the router has no engine
`/server_info` or `/metrics`), and tears the deployment down on exit -- also on Ctrl-C or an error.
Both imports are lazy: `--url` benches never load the schemas or the engine.
"""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Callable, Iterator, Sequence
from typing import TYPE_CHECKING, Any

from specctl.bench.probe import merge_server_info
from specctl.bench.runner import Provenance
from specctl.preflight.reader import get_json
from specctl.schemas import server_info as si

if TYPE_CHECKING:
    from specctl.orchestrate.launcher import Launcher, ProcessStatus
    from specctl.schemas.deployment import Deployment


@dataclasses.dataclass(frozen=True)
class Target:
    url: str
    provenance: Provenance = Provenance()


READY_TIMEOUT_S = 600.0


@contextlib.contextmanager
def launched(source: str, overrides: Sequence[str] = (), *,
             status_callback: Callable[[list[ProcessStatus]], None] | None = None) -> Iterator[Target]:
    from specctl.schemas.deployment import load_deployment

    deployment = load_deployment(source, overrides=overrides)
    with _launch(deployment, overrides, status_callback) as (url, info, roles):
        if roles:  # behind a router: the decodes' own registration fingerprint
            info = merge_server_info({name: _get_info(role_url) for name, role_url in roles})
        yield Target(url=url, provenance=Provenance(
            deployment={"name": deployment.name, "path": deployment.path, "config": deployment.raw},
            fingerprint=si.fingerprint(info), preflight=preflight_of(deployment), roles=roles))


def preflight_of(deployment: Deployment) -> dict[str, Any] | None:
    """The live preflight of a launched deployment's prefill and decode (None without a PD pair, or
    when a server cannot be read: provenance, never a precondition -- the launcher's handshake gates)."""
    from specctl.errors import SpecctlError
    from specctl.preflight.check import pair_urls_of, run_preflight

    if "prefill" not in deployment.roles or "decode" not in deployment.roles:
        return None
    try:
        prefill_url, decode_url, _ = pair_urls_of(deployment)  # 0.0.0.0 / IPv6 hosts handled there
        report = run_preflight(prefill_url, decode_url, timeout_s=10)
    except (SpecctlError, KeyError, TypeError):
        return None
    return {"ok": report.ok, **report.fingerprints()}


@contextlib.contextmanager
def _launch(deployment: Deployment, overrides: Sequence[str],
            status_callback: Callable[[list[ProcessStatus]], None] | None,
            ) -> Iterator[tuple[str, dict[str, Any] | None, tuple[tuple[str, str], ...]]]:
    """(router URL, its /server_info or None, the engine roles behind a router as (name, URL)) while the
    deployment runs; torn down on exit."""
    from specctl.orchestrate.launcher import Launcher

    # The process-level launcher (the one `specctl up` drives): start, wait until every role is
    # paired and ready, and stop everything on the way out (errors and Ctrl-C included).
    launcher = Launcher(deployment, overrides=tuple(overrides))
    with launcher:
        launcher.wait_ready(READY_TIMEOUT_S, on_status=status_callback)
        yield str(launcher.url), _get_info(str(launcher.url)), engine_roles(launcher)


def engine_roles(launcher: Launcher) -> tuple[tuple[str, str], ...]:
    """(instance name, URL) of every engine process behind the launcher's router; () without a router
    (a colocated server is itself the URL under load)."""
    if "router" not in launcher.roles:
        return ()
    return tuple((name, st.url) for name, st in launcher.status.items() if name.partition(".")[0] != "router")


def _get_info(url: str) -> dict[str, Any] | None:
    """The server's /server_info, or None when it did not answer one (no server, an error status, or an
    answer that is not HTTP or not a JSON object)."""
    body, code = get_json(url.rstrip("/") + "/server_info", 5.0)
    return body if code == 200 and body else None
