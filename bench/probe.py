"""ServerProbe: the bench client's side-channel GETs (`/v1/models`, `/server_info`, `/metrics`).

All best-effort with a short timeout: a server without an endpoint (404), with a non-JSON answer,
or slow to answer yields None and the report says "n/a". `/server_info` falls back to SGLang's
`/get_server_info`.

Behind a PD router (smg or sglang-router) the URL under load is the router's, which has no engine
`/server_info` or engine `/metrics` (smg forwards `/get_server_info` to a prefill, which runs no
speculation): `DeploymentProbe` snapshots the launched roles themselves, or the workers smg lists
(every prefill and decode instance, plus the front URL's own `/metrics` if it has one) and merges
them into one `ServerSnapshot` the record's readers take as is (`merge_server_info`,
`merge_metrics`). The load still goes through the router; only the probes go around it.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import time
from collections.abc import Mapping, Sequence
from typing import Any

import aiohttp


@dataclasses.dataclass(frozen=True)
class ServerSnapshot:
    wall_time: float
    server_info: dict[str, Any] | None
    metrics_text: str | None
    # Each launched role's own /server_info (instance name -> info), when probed behind a router.
    roles: Mapping[str, dict[str, Any] | None] = dataclasses.field(default_factory=dict)


class ServerProbe:
    def __init__(self, session: aiohttp.ClientSession, url: str, *, timeout_s: float = 5.0) -> None:
        self._session = session
        self._url = url.rstrip("/")
        self._timeout = aiohttp.ClientTimeout(total=timeout_s)
        self._info_paths = ["/server_info", "/get_server_info"]

    async def get_text(self, path: str) -> str | None:
        try:
            async with self._session.get(self._url + path, timeout=self._timeout) as resp:
                if resp.status != 200:
                    return None
                return await resp.text(errors="replace")
        except (aiohttp.ClientError, OSError, asyncio.TimeoutError):
            return None

    async def get_json(self, path: str) -> Any:
        text = await self.get_text(path)
        if text is None:
            return None
        try:
            return json.loads(text)
        except (ValueError, RecursionError):  # RecursionError: nested too deep; best effort, so n/a
            return None

    async def first_model(self) -> str | None:
        data = await self.get_json("/v1/models")
        items = data.get("data") if isinstance(data, dict) else None
        if isinstance(items, list) and items and isinstance(items[0], dict) and isinstance(items[0].get("id"), str):
            return str(items[0]["id"])
        return None

    async def server_info(self) -> dict[str, Any] | None:
        for path in list(self._info_paths):
            data = await self.get_json(path)
            if isinstance(data, dict):
                self._info_paths = [path]  # remember which one this server has
                return data
        return None

    async def snapshot(self) -> ServerSnapshot:
        info, metrics = await asyncio.gather(self.server_info(), self.get_text("/metrics"))
        return ServerSnapshot(time.time(), info, metrics)

    async def router_workers(self) -> tuple[tuple[str, str], ...]:
        """The prefill and decode workers a PD router lists (smg's `GET /workers`: `worker_type` and `url`
        per worker), named as the launcher names instances (`prefill`, `prefill.1`, `decode`, ...); empty
        when the URL is no such router (an engine, sglang-router, a router with regular workers)."""
        data = await self.get_json("/workers")
        workers = data.get("workers") if isinstance(data, dict) else None
        seen: dict[str, int] = {}
        out: list[tuple[str, str]] = []
        for w in workers if isinstance(workers, list) else []:
            kind, url = (w.get("worker_type"), w.get("url")) if isinstance(w, dict) else (None, None)
            if kind in ("prefill", "decode") and isinstance(url, str) and url.startswith(("http://", "https://")):
                index = seen[kind] = seen.get(kind, -1) + 1
                out.append((kind if index == 0 else f"{kind}.{index}", url))
        return tuple(out) if any(name.startswith("decode") for name, _ in out) else ()


class DeploymentProbe:
    """Snapshots of a launched deployment: its roles' own `/server_info` and `/metrics`, merged.

    `roles` are (instance name, URL) pairs as the launcher names them (`prefill`, `prefill.1`,
    `decode`, ...); `front` is the URL the load goes to (the router), scraped for `/metrics` only."""

    def __init__(self, session: aiohttp.ClientSession, front: str, roles: Sequence[tuple[str, str]], *,
                 timeout_s: float = 5.0) -> None:
        self._front = ServerProbe(session, front, timeout_s=timeout_s)
        self._roles = [(name, ServerProbe(session, url, timeout_s=timeout_s)) for name, url in roles]

    async def snapshot(self) -> ServerSnapshot:
        front_metrics = self._front.get_text("/metrics")
        infos = asyncio.gather(*(p.server_info() for _, p in self._roles))
        scrapes = asyncio.gather(*(p.get_text("/metrics") for _, p in self._roles))
        front_text, info_list, text_list = await asyncio.gather(front_metrics, infos, scrapes)
        names = [name for name, _ in self._roles]
        per_role = dict(zip(names, info_list, strict=True))
        texts: dict[str, str | None] = {"router": front_text, **dict(zip(names, text_list, strict=True))}
        return ServerSnapshot(time.time(), merge_server_info(per_role), merge_metrics(texts), per_role)


def _role(name: str) -> str:
    return name.partition(".")[0]


def merge_server_info(infos: Mapping[str, dict[str, Any] | None]) -> dict[str, Any] | None:
    """One `/server_info` for the record from each role's own: decode's (it runs the speculation and
    the adaptive controller). Several decodes: SGLang's `internal_states` one entry per instance (their
    mean is the accept length, as for DP ranks), every instance's switches (tagged `instance`) in time
    order, batches per step count summed, the mean step time averaged. `fingerprint` is the decodes'
    registration fingerprint (one value when the instances agree, else `name=fp` per instance).
    None when no role answered."""
    live = {n: i for n, i in infos.items() if isinstance(i, dict)}
    decodes = {n: i for n, i in live.items() if _role(n) == "decode"} or live
    if not decodes:
        return None
    fps = {n: _registration_fingerprint(i) for n, i in decodes.items()}
    known = {n: fp for n, fp in fps.items() if fp is not None}
    fingerprint = None
    if known:
        fingerprint = (next(iter(known.values())) if len(set(known.values())) == 1
                       else ",".join(f"{n}={fp}" for n, fp in sorted(known.items())))
    if len(decodes) == 1:
        (info,) = decodes.values()
        merged = dict(info)
        if fingerprint is not None:
            merged["fingerprint"] = fingerprint
        return merged
    states: list[Any] = []
    switches: list[dict[str, Any]] = []
    per_steps: dict[str, float] = {}
    step_s: list[float] = []
    adaptive: dict[str, Any] | None = None
    for name, info in sorted(decodes.items()):
        own = info.get("internal_states")
        if isinstance(own, list):
            states.extend(s for s in own if isinstance(s, dict))
        ad = info.get("adaptive")
        if isinstance(ad, dict):
            adaptive = adaptive or {k: v for k, v in ad.items() if k not in ("switches", "batches_per_steps")}
            switches.extend({**s, "instance": name} for s in ad.get("switches") or [] if isinstance(s, dict))
            for k, v in (ad.get("batches_per_steps") or {}).items():
                if isinstance(v, (int, float)) and not isinstance(v, bool):
                    per_steps[str(k)] = per_steps.get(str(k), 0) + v
        mean = (info.get("timing") or {}).get("mean_step_s")
        if isinstance(mean, (int, float)) and not isinstance(mean, bool):
            step_s.append(float(mean))
    switches.sort(key=_switch_time)
    out: dict[str, Any] = {"internal_states": states, "instances": sorted(decodes)}
    if adaptive is not None:
        out["adaptive"] = {**adaptive, "switches": switches, "batches_per_steps": per_steps}
    if step_s:
        out["timing"] = {"mean_step_s": sum(step_s) / len(step_s)}
    if fingerprint is not None:
        out["fingerprint"] = fingerprint
    return out


def _switch_time(switch: dict[str, Any]) -> float:
    t = switch.get("time")
    return float(t) if isinstance(t, (int, float)) and not isinstance(t, bool) else 0.0


def _registration_fingerprint(info: dict[str, Any]) -> str | None:
    fps = info.get("fingerprints")
    value = fps.get("registration") if isinstance(fps, dict) else None
    return str(value) if isinstance(value, (str, int)) and not isinstance(value, bool) else None


def merge_metrics(texts: Mapping[str, str | None]) -> str | None:
    """One Prometheus exposition from several scrapes: every sample gets an `instance="<name>"` label
    (so the same series of two processes stay apart and before/after deltas pair up per process);
    `# TYPE` and `# HELP` lines are kept once per family. None when no scrape answered."""
    lines: list[str] = []
    typed: set[tuple[str, str]] = set()
    for name, text in texts.items():
        if not text:
            continue
        for line in text.splitlines():
            stripped = line.strip()
            if not stripped:
                continue
            if stripped.startswith("#"):
                parts = stripped.split()
                if len(parts) >= 3 and parts[1] in ("TYPE", "HELP"):
                    if (parts[1], parts[2]) in typed:
                        continue
                    typed.add((parts[1], parts[2]))
                lines.append(stripped)
                continue
            lines.append(_with_instance(stripped, name))
    return "\n".join(lines) + "\n" if lines else None


def _with_instance(sample: str, name: str) -> str:
    label = 'instance="' + name.replace("\\", "\\\\").replace('"', '\\"') + '"'
    head, sep, rest = sample.partition("{")
    if sep and " " not in head:
        return f"{head}{{{label},{rest}" if not rest.startswith("}") else f"{head}{{{label}{rest}"
    metric, _, value = sample.partition(" ")
    return f"{metric}{{{label}}} {value}"
