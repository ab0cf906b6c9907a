"""The live check of a running prefill/decode pair: one `Watch.tick()` per refresh, alerts by name.

Each tick reads every role's `/metrics` (SGLang's `sglang:` and specctl's `specctl_` families alike) and
`/get_load`, and re-runs the preflight comparison (`run_preflight`: the pair with each other, and with the
deployment when one is given), so a server that restarted with another configuration is a finding on the
next tick. Derived per tick:

- requests running / waiting per role; the P/D load ratio (prefill's requests over decode's);
- transfer throughput (bytes prefill sent, else decode received, per second since the last tick; SGLang:
  `kv_transfer_total_mb`) and transfer errors (`specctl_transfer_failures_total`,
  `sglang:num_transfer_failed_reqs_total` + `num_bootstrap_failed_reqs_total`);
- the time since the transfer counter last moved while prefill holds requests waiting to transfer (specctl:
  its open rooms, SGLang: `num_prefill_inflight_queue_reqs`): a stall once it reaches `stall_after_s`;
- the accept length (tokens per verify, SGLang's convention) from the verify counters' deltas (SGLang: its
  gauge) and the adaptive tier (`specctl_adaptive_steps`, `sglang:spec_num_steps`), beside the tier the
  deployment's adaptive config settles at for that acceptance at the observed batch size (`expected_tier`).

Alerts (`Alert.name`): `server_unreachable` (a role did not answer), `transfer_stall`, `transfer_errors`
(the error counter moved), `pair_mismatch` (prefill and decode disagree), `deployment_drift` (a server
differs from the deployment), `server_changed` (a server's preflight fingerprint differs from the one it
had at the first tick: it restarted with another configuration), `acceptance_collapse` (accept length
below half the best the watch has seen, over a tick with at least `MIN_VERIFIES` verifies). Torch-free.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from specctl.bench.prometheus import parse_metrics
from specctl.errors import RuntimeFailure, UsageError
from specctl.preflight.check import run_preflight
from specctl.preflight.reader import MAX_BODY, Unreachable, http_get
from specctl.schemas.role_config import RoleConfig

MIN_VERIFIES = 20  # verifies in a tick below which its accept length is too noisy to alert on
COLLAPSE_RATIO = 0.5
ALERTS = ("server_unreachable", "transfer_stall", "transfer_errors", "pair_mismatch", "deployment_drift",
          "server_changed", "acceptance_collapse")


@dataclass(frozen=True)
class Alert:
    name: str
    role: str
    message: str
    fix: str = ""

    def to_json(self) -> dict[str, str]:
        return {"name": self.name, "role": self.role, "message": self.message, "fix": self.fix}


@dataclass(frozen=True)
class RoleSample:
    """One server at one tick: what its /metrics and /get_load said (None: it did not say)."""

    role: str
    url: str
    error: str | None = None
    running: float | None = None
    waiting: float | None = None
    in_transfer: float | None = None  # requests waiting for their KV transfer (prefill side)
    transfer_bytes: float | None = None  # cumulative
    transfer_errors: float | None = None  # cumulative
    verifies: float | None = None  # cumulative verify steps
    accepted: float | None = None  # cumulative accepted drafts
    accept_length_gauge: float | None = None  # SGLang's own gauge (tokens per verify)
    tier: dict[str, float] = field(default_factory=dict)  # adaptive steps per bucket ("" for SGLang's one gauge)
    family: str | None = None  # "specctl" | "sglang"

    @property
    def up(self) -> bool:
        return self.error is None

    @property
    def load(self) -> float | None:
        if self.running is None and self.waiting is None:
            return None
        return (self.running or 0.0) + (self.waiting or 0.0)


def _get(url: str, timeout_s: float) -> str | None:
    """The body of a 2xx answer, None for any other HTTP answer; Unreachable, or ValueError past MAX_BODY."""
    answer = http_get(url, timeout_s)
    if len(answer.body) > MAX_BODY:
        raise ValueError(f"{url}: more than {MAX_BODY >> 20} MiB")
    return answer.body.decode("utf-8", errors="replace") if 200 <= answer.status < 300 else None


def _sum(samples: Mapping[str, float], *names: str) -> float | None:
    """The sum of every series of the first of `names` present (labels and ranks summed), else None."""
    for name in names:
        vals = [v for k, v in samples.items() if k == name or k.startswith(name + "{")]
        if vals:
            return float(sum(vals))
    return None


def _label(key: str, label: str) -> str:
    at = key.find(f'{label}="')
    if at < 0:
        return ""
    rest = key[at + len(label) + 2:]
    return rest[:rest.find('"')]


def read_role(role: str, url: str, *, timeout_s: float = 5.0) -> RoleSample:
    """Scrape one server; a server that does not answer is a sample with `error` set, never an exception."""
    try:
        # None: it answers, without metrics here (sglang-router serves them on a port of their own)
        text = _get(url + "/metrics", timeout_s) or ""
    except (Unreachable, ValueError) as exc:
        return RoleSample(role, url, error=f"{url}/metrics: {exc}")
    s, _ = parse_metrics(text)
    family = "sglang" if any(k.startswith("sglang:") for k in s) else "specctl" if any(
        k.startswith("specctl_") for k in s) else None
    load: dict[str, Any] = {}
    try:
        got = json.loads(_get(url + "/get_load", timeout_s) or "null")
        if isinstance(got, list) and got and isinstance(got[0], dict):
            load = got[0]
    except (Unreachable, ValueError):
        pass
    running = _sum(s, "specctl_requests_running", "sglang:num_running_reqs")
    waiting = _sum(s, "specctl_requests_waiting", "sglang:num_queue_reqs")
    in_transfer = _sum(s, "sglang:num_prefill_inflight_queue_reqs")
    if in_transfer is None and role == "prefill" and isinstance(load.get("num_reqs"), (int, float)):
        in_transfer = float(load["num_reqs"])  # specctl's prefill: its open rooms
    if role == "decode" and isinstance(load.get("num_reqs"), (int, float)) and family == "specctl":
        waiting = max(0.0, float(load["num_reqs"]) - (running or 0.0))  # admitted, KV not yet in
    sent = _sum(s, 'specctl_transfer_bytes_total{direction="sent"}') if role == "prefill" else None
    received = _sum(s, 'specctl_transfer_bytes_total{direction="received"}')
    mb = _sum(s, "sglang:kv_transfer_total_mb")
    tbytes = sent if sent is not None else received if received is not None else (mb * 1e6 if mb is not None
                                                                                 else None)
    errors = _sum(s, "specctl_transfer_failures_total")
    sg = [x for x in (_sum(s, "sglang:num_transfer_failed_reqs_total"),
                      _sum(s, "sglang:num_bootstrap_failed_reqs_total")) if x is not None]
    if sg:
        errors = (errors or 0.0) + sum(sg)
    tier = {_label(k, "bucket"): v for k, v in s.items() if k.startswith("specctl_adaptive_steps")}
    steps = _sum(s, "sglang:spec_num_steps")
    if steps is not None:
        tier[""] = steps
    gauge = s.get("sglang:spec_accept_length")
    if gauge is None:
        gauge = next((v for k, v in s.items() if k.startswith("sglang:spec_accept_length{")), None)
    return RoleSample(role, url, None, running, waiting, in_transfer, tbytes, errors,
                      _sum(s, "specctl_spec_verify_steps_total", "sglang:spec_verify_calls_total"),
                      _sum(s, "specctl_spec_accepted_tokens_total"), gauge, tier, family)


@dataclass(frozen=True)
class Tick:
    """One refresh: the samples, what was derived from them, the preflight re-run, and the alerts."""

    time: float
    index: int
    roles: tuple[RoleSample, ...]
    transfer_bytes_per_s: float | None
    transfer_errors: float | None  # since the last tick
    since_transfer_s: float | None  # while requests wait to transfer; None when none wait
    pd_load_ratio: float | None
    accept_length: float | None
    tier: dict[str, float]
    expected_tier: int | None
    preflight: dict[str, Any] | None
    alerts: tuple[Alert, ...]

    def role(self, name: str) -> RoleSample | None:
        return next((r for r in self.roles if r.role == name), None)

    def to_json(self) -> dict[str, Any]:
        return {
            "time": round(self.time, 3), "tick": self.index,
            "roles": {r.role: {"url": r.url, "up": r.up, "error": r.error, "engine": r.family, "running": r.running,
                               "waiting": r.waiting, "in_transfer": r.in_transfer} for r in self.roles},
            "transfer_bytes_per_s": self.transfer_bytes_per_s, "transfer_errors": self.transfer_errors,
            "since_last_transfer_s": self.since_transfer_s, "pd_load_ratio": self.pd_load_ratio,
            "accept_length": self.accept_length, "adaptive_tier": self.tier, "expected_tier": self.expected_tier,
            "preflight": self.preflight, "alerts": [a.to_json() for a in self.alerts],
        }


# the tier an adaptive config settles at for a steady acceptance: (accepted drafts per verify, batch) -> steps
TierModel = Callable[[float, int], int | None]


def policy_tier(adaptive: Mapping[str, Any] | None, initial_steps: int) -> TierModel | None:
    """A `TierModel` from a deployment's `speculative.adaptive` block: the engine's own policy fed a steady
    acceptance (min(accepted, steps) each verify) until it settles. None without adaptive."""
    if not adaptive:
        return None
    from specctl.adaptive.policy import AdaptivePolicy
    from specctl.schemas.adaptive import parse_deployment_adaptive

    cfg, findings = parse_deployment_adaptive(dict(adaptive))
    if cfg is None:
        return None

    def settle(accepted: float, batch: int) -> int | None:
        policy = AdaptivePolicy(cfg, initial_steps=initial_steps, clock=lambda: 0.0)
        b = max(1, batch)
        for _ in range(400):
            k = policy.steps_for_batch(b)
            policy.on_verify_complete([min(accepted, k)] * b, b)  # type: ignore[list-item]
        return policy.steps_for_batch(b)

    return settle


class Watch:
    """Ticks over one pair (and its router); keeps what a tick compares with the previous ones."""

    def __init__(self, prefill: str, decode: str, router: str | None = None, *, bootstrap_port: int | None = None,
                 deployment_roles: Mapping[str, RoleConfig] | None = None,
                 tier_model: TierModel | None = None, stall_after_s: float = 5.0, timeout_s: float = 5.0,
                 clock: Callable[[], float] = time.monotonic) -> None:
        if stall_after_s <= 0 or timeout_s <= 0:
            raise UsageError("the stall threshold and the request timeout must be > 0 seconds")
        self.urls = {"prefill": prefill.rstrip("/"), "decode": decode.rstrip("/")}
        if router:
            self.urls["router"] = router.rstrip("/")
        self.bootstrap_port = bootstrap_port
        self.deployment_roles = deployment_roles
        self.tier_model = tier_model
        self.stall_after_s = stall_after_s
        self.timeout_s = timeout_s
        self.clock = clock
        self.index = 0
        self._prev: Tick | None = None
        self._last_move: float | None = None
        self._fingerprints: dict[str, str] = {}
        self._best_accept = 0.0

    def tick(self) -> Tick:
        now = self.clock()
        roles = tuple(read_role(name, url, timeout_s=self.timeout_s) for name, url in self.urls.items())
        alerts = [Alert("server_unreachable", r.role, f"{r.role} does not answer: {r.error}",
                        f"is the {r.role} server running? (`specctl up` restarts a role that exits)")
                  for r in roles if not r.up]
        by = {r.role: r for r in roles}
        prev = self._prev
        dt = now - prev.time if prev is not None else None
        pre, dec = by["prefill"], by["decode"]

        moved = _delta(pre.transfer_bytes, prev.role("prefill"), "transfer_bytes") if prev else None
        if moved is None and prev:
            moved = _delta(dec.transfer_bytes, prev.role("decode"), "transfer_bytes")
        rate = moved / dt if moved is not None and dt else None
        if self._last_move is None or (moved is not None and moved > 0):
            self._last_move = now
        since = None
        if pre.up and (pre.in_transfer or 0) > 0:
            since = now - self._last_move
            if since >= self.stall_after_s:
                alerts.append(Alert("transfer_stall", "prefill",
                                    f"{pre.in_transfer:.0f} request(s) wait to transfer and nothing has moved for "
                                    f"{since:.1f} s", "check decode's link to prefill (its log, the transfer "
                                    "backend); a request past transfer.timeout_s fails with 408"))
        errs = None
        if prev is not None:
            deltas = [d for d in (_delta(r.transfer_errors, prev.role(r.role), "transfer_errors") for r in roles)
                      if d is not None]
            errs = sum(deltas) if deltas else None
            if errs:
                alerts.append(Alert("transfer_errors", "pair", f"{errs:.0f} transfer error(s) since the last tick",
                                    "read the prefill and decode logs for the failed rooms"))
        ratio = pre.load / dec.load if pre.load is not None and dec.load else None

        accept, tier, expected = self._acceptance(dec, prev.role("decode") if prev else None, alerts)
        report: dict[str, Any] | None = None
        if pre.up and dec.up:
            report = self._preflight(alerts)
        tick = Tick(now, self.index, roles, rate, errs, since, ratio, accept, tier, expected, report, tuple(alerts))
        self._prev = tick
        self.index += 1
        return tick

    def _acceptance(self, dec: RoleSample, before: RoleSample | None, alerts: list[Alert]
                    ) -> tuple[float | None, dict[str, float], int | None]:
        accept = dec.accept_length_gauge
        verifies = None
        if before is not None:
            verifies = _delta(dec.verifies, before, "verifies")
            acc = _delta(dec.accepted, before, "accepted")
            if verifies and acc is not None:
                accept = 1.0 + acc / verifies
        if accept is not None and (verifies is None or verifies >= MIN_VERIFIES):
            if self._best_accept and accept - 1.0 < COLLAPSE_RATIO * (self._best_accept - 1.0):
                alerts.append(Alert("acceptance_collapse", "decode",
                                    f"accept length {accept:.2f} (tokens per verify), the watch has seen "
                                    f"{self._best_accept:.2f}", "the traffic changed? record a trace and re-tune "
                                    "(`specctl bench --trace-out`, `specctl adaptive tune`)"))
            self._best_accept = max(self._best_accept, accept)
        expected = None
        if self.tier_model is not None and accept is not None and dec.running:
            expected = self.tier_model(accept - 1.0, int(round(dec.running)))
        return accept, dict(dec.tier), expected

    def _preflight(self, alerts: list[Alert]) -> dict[str, Any] | None:
        try:
            rep = run_preflight(self.urls["prefill"], self.urls["decode"], bootstrap_port=self.bootstrap_port,
                                deployment_roles=self.deployment_roles, timeout_s=self.timeout_s,
                                request_timeout_s=self.timeout_s)
        except RuntimeFailure as exc:
            alerts.append(Alert("server_unreachable", "pair", f"preflight could not read the pair: {exc}",
                                exc.hint or ""))
            return None
        for d in rep.differences:
            alerts.append(Alert("pair_mismatch", "pair", f"{d.field}: prefill {d.prefill!r}, decode {d.decode!r}",
                                d.fix))
        for drift in rep.drifts:
            alerts.append(Alert("deployment_drift", drift.role, f"{drift.field}: the deployment asks "
                                f"{drift.asked!r}, the server runs {drift.running!r}", drift.fix))
        for role, fp in rep.fingerprints().items():
            first = self._fingerprints.setdefault(role, fp)
            if fp != first:
                alerts.append(Alert("server_changed", role, f"{role}'s configuration fingerprint is {fp}, it was "
                                    f"{first} when the watch started: it restarted with another configuration",
                                    "compare `specctl preflight` with the deployment; restart it as it was"))
        return rep.to_json()


def _delta(now: float | None, before: RoleSample | None, attr: str) -> float | None:
    """A counter's increase since `before` (a counter that went down restarted: its value now is the increase)."""
    if now is None or before is None:
        return None
    was = getattr(before, attr)
    if was is None:
        return None
    return now - was if now >= was else now
