"""Adaptive speculative steps: the config model, batch-size routing, bucket sanity and step coverage.

One model serves both inputs: SGLang's own `--speculative-adaptive-config` JSON (integer-string keys
are batch-size buckets, every other top-level key is a global knob merged under each bucket, the bucket
winning) and the `speculative.adaptive` block of a deployment file (knobs plus a `buckets` mapping).
Parsing never raises on bad content: it returns the config SGLang would run (or None when nothing
usable is left) plus every `Finding`, ADP2xx for bucket sanity. `step_coverage` proves DESIGN rule 1:
which steps the runtime can select at each reachable (padded) batch size, hence which runtime states
must be prebuilt, with ADP1xx findings. The EMA policy that walks these buckets lives in
`specctl.engine.adaptive`. Torch-free: `specctl validate` imports this module.
"""

from __future__ import annotations

import bisect
import difflib
import json
import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from specctl.schemas.catalog import RuleDoc, register
from specctl.schemas.findings import Finding, Severity

STRATEGIES = ("ema", "throughput_aware")

# SGLang's defaults (adaptive_spec_params.AdaptiveStepSlot reads each with cfg.get(name, default)).
KNOB_DEFAULTS: dict[str, Any] = {
    "strategy": "ema",
    "ema_alpha": 0.2,
    "update_interval": 5,
    "warmup_batches": 10,
    "down_hysteresis": -0.25,
    "up_hysteresis": 0.0,
    "ceiling_coeff": 0,
}
EMA_KNOBS = ("ema_alpha", "update_interval", "warmup_batches", "down_hysteresis", "up_hysteresis", "ceiling_coeff")
# Settings only SGLang's throughput_aware controller reads (throughput_aware_controller.py).
THROUGHPUT_KEYS = (
    "window_size",
    "update_interval",
    "profile_run_batch_sizes",
    "max_profile_run_batch_size",
    "profile_run_n_warmup",
    "profile_run_n_measure",
    "profile_run_seq_len",
)
_KNOWN_KEYS = ("strategy", "candidate_steps", "buckets", *EMA_KNOBS, *THROUGHPUT_KEYS)
# Top-level keys of a deployment file: their presence means "this is not an SGLang adaptive JSON".
_DEPLOYMENT_KEYS = ("version", "speculative", "model", "roles", "serve", "cache", "transfer", "name")
_DIGITS = re.compile(r"[0-9]+")
_SIMPLE_KEY = re.compile(r"^[A-Za-z0-9_-]+$")

Mode = Literal["sglang", "deployment"]


@dataclass(frozen=True)
class Knobs:
    """The policy knobs of one bucket after merging (defaults < global knobs < bucket overrides)."""

    strategy: str = "ema"
    ema_alpha: float = 0.2
    update_interval: int = 5
    warmup_batches: int = 10
    down_hysteresis: float = -0.25
    up_hysteresis: float = 0.0
    ceiling_coeff: float = 0


@dataclass(frozen=True)
class Bucket:
    """One batch-size slot: batch sizes >= `min_batch_size` (up to the next bucket) choose among its steps.

    `candidate_steps` is sorted and de-duplicated, as SGLang uses it. `key` is the key as written and
    `path` the JSON path of the bucket in its file (for findings).
    """

    min_batch_size: int
    candidate_steps: tuple[int, ...]
    knobs: Knobs = field(default_factory=Knobs)
    key: str = ""
    path: str = ""

    @property
    def start_steps_default(self) -> int:
        """The step a slot starts at when the initial step is not one of its candidates."""
        return self.candidate_steps[len(self.candidate_steps) // 2]

    def start_steps(self, initial_steps: int) -> int:
        return initial_steps if initial_steps in self.candidate_steps else self.start_steps_default


def pad_batch_size(batch_size: int, graph_batch_sizes: Sequence[int]) -> int | None:
    """The graph batch size `batch_size` is padded up to: the smallest one >= it, None when none is."""
    graphs = sorted(set(graph_batch_sizes))
    i = bisect.bisect_left(graphs, batch_size)
    return graphs[i] if i < len(graphs) else None


@dataclass(frozen=True)
class AdaptiveConfig:
    """Buckets in ascending `min_batch_size` order (at least one) and the global strategy."""

    buckets: tuple[Bucket, ...]
    strategy: str = "ema"

    def __post_init__(self) -> None:
        # Internal invariant: parsers only build non-empty, sorted, unique-key configs.
        keys = [b.min_batch_size for b in self.buckets]
        assert keys and keys == sorted(set(keys)), keys

    @property
    def keys(self) -> tuple[int, ...]:
        return tuple(b.min_batch_size for b in self.buckets)

    def bucket(self, key: int) -> Bucket:
        return self.buckets[self.keys.index(key)]

    def route(self, batch_size: int, graph_batch_sizes: Sequence[int] = ()) -> Bucket:
        """SGLang's routing: pad up to the smallest graph batch size >= batch_size (if any), then take
        the bucket with the largest key <= that size, or the smallest bucket if none is."""
        padded = pad_batch_size(batch_size, graph_batch_sizes)
        size = batch_size if padded is None else padded
        i = bisect.bisect_right(self.keys, size) - 1
        return self.buckets[max(0, i)]

    @property
    def union_steps(self) -> tuple[int, ...]:
        return tuple(sorted({s for b in self.buckets for s in b.candidate_steps}))

    @property
    def default_initial_steps(self) -> int:
        """SGLang's `--speculative-num-steps` when not given: the middle of the union of candidates."""
        union = self.union_steps
        return union[len(union) // 2]

    @classmethod
    def sglang_default(cls) -> AdaptiveConfig:
        """SGLang's DEFAULT_ADAPTIVE_CONFIG (used when no config file is passed)."""
        cfg, findings = parse_sglang_config(SGLANG_DEFAULT_CONFIG)
        assert cfg is not None and not findings, findings
        return cfg


SGLANG_DEFAULT_CONFIG: dict[str, Any] = {
    "1": {"candidate_steps": [1, 3, 5, 7], "up_hysteresis": 0.0, "down_hysteresis": -0.25, "ceiling_coeff": 0},
    "8": {"candidate_steps": [0, 1, 3], "up_hysteresis": 0.0, "down_hysteresis": 0.0, "ceiling_coeff": 0},
    "32": {"candidate_steps": [0, 1], "up_hysteresis": 0.0, "down_hysteresis": 0.0, "ceiling_coeff": 0},
    "64": {"candidate_steps": [0], "up_hysteresis": 0.0, "down_hysteresis": 0.0, "ceiling_coeff": 0},
}


# --------------------------------------------------------------------------------------------------
# Parsing (bucket sanity, ADP2xx)
# --------------------------------------------------------------------------------------------------


def looks_like_sglang_adaptive(obj: Any) -> bool:
    """True for a JSON object shaped like SGLang's adaptive config rather than a deployment file."""
    if not isinstance(obj, Mapping) or not obj:
        return False
    keys = [str(k) for k in obj]
    if any(k in _DEPLOYMENT_KEYS for k in keys):
        return False
    if any(_DIGITS.fullmatch(k) for k in keys):
        return True
    if any(isinstance(v, Mapping) and "candidate_steps" in v for v in obj.values()):
        return True
    return all(k in _KNOWN_KEYS for k in keys)


def child_path(base: str, key: str | int) -> str:
    """Append a key or list index to a JSON path the way the loader records positions (list items as
    `.0`; odd keys quoted: `$["a b"]`), so findings get line numbers."""
    if isinstance(key, int) or _SIMPLE_KEY.match(key):
        return f"{base}.{key}"
    escaped = key.replace("\\", "\\\\").replace('"', '\\"')
    return f'{base}["{escaped}"]'


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _is_number(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


def _show(v: Any) -> str:
    """A value as the user wrote it in JSON terms (true, null, "x")."""
    if v is True:
        return "true"
    if v is False:
        return "false"
    if v is None:
        return "null"
    if isinstance(v, str):
        return f'"{v}"'
    try:
        text = json.dumps(v, allow_nan=True)
    except (TypeError, ValueError):
        text = repr(v)
    return text if len(text) <= 60 else text[:57] + "..."


class _Parser:
    """Collects findings while turning one adaptive section into an `AdaptiveConfig`."""

    def __init__(self, mode: Mode, base_path: str) -> None:
        self.mode = mode
        self.base = base_path
        self.findings: list[Finding] = []

    def add(self, code: str, severity: Severity, path: str, message: str, fix: str) -> None:
        self.findings.append(Finding(code=code, severity=severity, path=path, message=message, fix=fix))

    def bucket_path(self, key: str) -> str:
        return child_path(self.base, key) if self.mode == "sglang" else child_path(f"{self.base}.buckets", key)

    @staticmethod
    def bucket_word(key: str) -> str:
        return f'bucket "{key}"'

    # -- knobs -------------------------------------------------------------------------------------

    def knob(self, name: str, value: Any, path: str) -> Any | None:
        """The value if valid for `name`, else None after recording a finding."""
        if name == "ema_alpha":
            if _is_number(value) and 0 < value <= 1:
                return value
            self.add(
                "ADP212", "error", path,
                f"ema_alpha is {_show(value)}; it must be a number with 0 < ema_alpha <= 1 "
                "(0 freezes the EMA; above 1 it overshoots every observation)",
                "set ema_alpha to a number in (0, 1], e.g. 0.2 (SGLang's default)",
            )
        elif name == "update_interval":
            if _is_int(value) and value >= 1:
                return value
            why = " (SGLang divides by it: ZeroDivisionError at the first decision)" if value == 0 else ""
            self.add(
                "ADP211", "error", path,
                f"update_interval is {_show(value)}; it must be an integer >= 1{why}",
                "set update_interval to a positive integer, e.g. 5 (SGLang's default)",
            )
        elif name == "warmup_batches":
            if _is_int(value) and value >= 0:
                return value
            self.add(
                "ADP213", "error", path,
                f"warmup_batches is {_show(value)}; it must be an integer >= 0",
                "set warmup_batches to a non-negative integer, e.g. 10 (SGLang's default)",
            )
        elif name in ("down_hysteresis", "up_hysteresis"):
            if _is_number(value):
                return value
            self.add(
                "ADP214", "error", path,
                f"{name} is {_show(value)}; it must be a finite number",
                f"set {name} to a number, e.g. {KNOB_DEFAULTS[name]} (SGLang's default)",
            )
        elif name == "ceiling_coeff":
            if _is_number(value) and value >= 0:
                return value
            self.add(
                "ADP214", "error", path,
                f"ceiling_coeff is {_show(value)}; it must be a finite number >= 0 (0 disables the ceiling)",
                "set ceiling_coeff to 0 (off) or a positive number",
            )
        elif name in THROUGHPUT_KEYS:
            ok = value is None if name.startswith(("profile_run_batch", "max_profile", "profile_run_seq")) else False
            if name == "profile_run_batch_sizes" and isinstance(value, list):
                ok = all(_is_int(v) and v >= 1 for v in value)
            elif _is_int(value):
                ok = value >= (0 if name == "profile_run_n_warmup" else 1)
            if ok:
                return value
            self.add(
                "ADP214", "error", path,
                f"{name} is {_show(value)}; throughput_aware needs a positive integer here"
                + (" (or a list of them)" if name == "profile_run_batch_sizes" else ""),
                f"set {name} to a positive integer or remove it to use SGLang's default",
            )
        return None

    def strategy(self, obj: Mapping[str, Any]) -> str:
        value = obj.get("strategy", "ema")
        if value in STRATEGIES:
            return value
        close = difflib.get_close_matches(str(value), STRATEGIES, n=1)
        self.add(
            "ADP215", "error", f"{self.base}.strategy",
            f"strategy is {_show(value)}; SGLang accepts only 'ema' or 'throughput_aware' (ValueError at start-up)",
            f'set strategy to "{close[0] if close else "ema"}"',
        )
        return "ema"

    def unsupported_strategy(self, strategy: str) -> None:
        if strategy != "throughput_aware":
            return
        if self.mode == "deployment":
            self.add(
                "ADP216", "error", f"{self.base}.strategy",
                "strategy is 'throughput_aware'; specctl's engine implements only the 'ema' policy "
                "(throughput_aware needs SGLang's start-up cost profiling) and would refuse to start",
                'set strategy to "ema" (or remove it)',
            )
        else:
            self.add(
                "ADP217", "warning", f"{self.base}.strategy",
                "strategy is 'throughput_aware'; specctl checks its buckets but cannot simulate it "
                "(its decisions depend on SGLang's start-up cost profiling)",
                'use strategy "ema" to replay traces with `specctl adaptive simulate`',
            )

    def ignored_for_strategy(self, key: str, path: str, strategy: str) -> bool:
        """Report keys that the chosen strategy never reads; True when `key` was such a key."""
        if strategy == "ema" and key in THROUGHPUT_KEYS and key not in EMA_KNOBS:
            other = "throughput_aware"
        elif strategy == "throughput_aware" and key in EMA_KNOBS and key not in THROUGHPUT_KEYS:
            other = "ema"
        else:
            return False
        self.add(
            "ADP210", "warning", path,
            f"{key} is read only by strategy '{other}'; with strategy '{strategy}' SGLang ignores it",
            f'remove {key}, or set strategy to "{other}"',
        )
        return True

    def unknown_key(self, key: str, path: str, *, in_bucket: bool) -> None:
        choices = ["candidate_steps"] if in_bucket else ["strategy"]
        choices += [*EMA_KNOBS, *(k for k in THROUGHPUT_KEYS if k not in EMA_KNOBS)]
        close = difflib.get_close_matches(key, choices, n=1, cutoff=0.6)
        hint = f' Did you mean "{close[0]}"?' if close else f" Known knobs: {', '.join(EMA_KNOBS)}."
        self.add(
            "ADP209", "error", path,
            f'key "{key}" is not a setting SGLang reads; it is silently ignored, so the setting you meant '
            f"never applies.{hint}",
            f'rename "{key}" to "{close[0]}"' if close else f'remove "{key}"',
        )

    def top_level_key(self, key: str) -> None:
        """A top-level SGLang key that is neither a digit-only bucket key nor a known setting."""
        path = child_path(self.base, key)
        knob_like = difflib.get_close_matches(key, [*EMA_KNOBS, *THROUGHPUT_KEYS, "strategy"], n=1, cutoff=0.75)
        if re.search(r"[0-9]", key) and not knob_like:
            # "bs8", "-8", "8.0": meant as a bucket, but SGLang's key.isdigit() skips it silently.
            self.bucket_key(key, path)
        else:
            self.unknown_key(key, path, in_bucket=False)

    # -- buckets -----------------------------------------------------------------------------------

    def bucket_key(self, key: str, path: str) -> int | None:
        """The batch-size lower bound of a bucket key, or None (with a finding) if it is not one."""
        if _DIGITS.fullmatch(key):
            value = int(key)
            if value == 0:
                self.add(
                    "ADP207", "warning", path,
                    'bucket key "0" is not a positive batch size; it acts as the smallest bucket '
                    "(batch sizes start at 1)",
                    'rename bucket "0" to "1"',
                )
            return value
        digits = re.findall(r"[0-9]+", key)
        guess = f' — did you mean "{int(digits[0])}"?' if len(digits) == 1 else ""
        if self.mode == "sglang":
            msg = (
                f'key "{key}" looks like a batch-size bucket but is not a digit-only string; SGLang '
                f"treats it as an unknown global knob and silently ignores it{guess}"
            )
        else:
            msg = f'bucket key "{key}" is not a positive integer batch size{guess}'
        self.add(
            "ADP206", "error", path, msg,
            f'rename the key to "{int(digits[0])}"'
            if len(digits) == 1
            else "use a positive integer batch size as the key",
        )
        return None

    def candidates(self, key: str, entry: Any, path: str, strategy: str) -> tuple[int, ...] | None:
        word = self.bucket_word(key)
        if not isinstance(entry, Mapping):
            shown = _show(entry) if isinstance(entry, list) else "[1, 3]"
            wrap = f'{{"candidate_steps": {shown}}}'
            self.add(
                "ADP202", "error", path,
                f"{word} must be an object with candidate_steps, got {_show(entry)} "
                "(SGLang fails with AttributeError at start-up)",
                f"write {word} as {wrap}",
            )
            return None
        cpath = f"{path}.candidate_steps"
        steps = entry.get("candidate_steps")
        if not isinstance(steps, list) or not steps:
            self.add(
                "ADP202", "error", cpath if "candidate_steps" in entry else path,
                f"{word}: candidate_steps must be a non-empty list of non-negative ints, got {_show(steps)} "
                "(SGLang raises ValueError at start-up)",
                f"set candidate_steps of {word} to a list such as [1, 3]",
            )
            return None
        out: list[int] = []
        floor = 1 if strategy == "throughput_aware" else 0
        for i, s in enumerate(steps):
            spath = f"{cpath}.{i}"
            if isinstance(s, bool):
                # SGLang's isinstance(s, int) check accepts booleans: true runs as 1 step, false as 0.
                self.add(
                    "ADP204", "error", spath,
                    f"{word}: candidate_steps[{i}] is {_show(s)}, a boolean; SGLang silently runs it as "
                    f"{int(s)} step{'s' if not s else ''}",
                    f"write {int(s)} instead of {_show(s)} in candidate_steps of {word}",
                )
                out.append(int(s))
            elif not _is_int(s) or s < floor:
                need = "positive ints (throughput_aware)" if floor else "non-negative ints"
                fix_value = int(s) if _is_number(s) and s >= floor and float(s).is_integer() else None
                self.add(
                    "ADP203", "error", spath,
                    f"{word}: candidate_steps[{i}] is {_show(s)}; candidate_steps must be {need} "
                    "(SGLang raises ValueError at start-up)",
                    f"write {fix_value} instead of {_show(s)}" if fix_value is not None
                    else f"remove {_show(s)} from candidate_steps of {word}",
                )
            else:
                out.append(s)
        dups = sorted({s for s in out if out.count(s) > 1})
        if dups:
            self.add(
                "ADP205", "warning", cpath,
                f"{word}: candidate_steps {_show(steps)} repeats {', '.join(map(str, dups))}; "
                "SGLang silently de-duplicates the list",
                f"write candidate_steps of {word} as {sorted(set(out))}",
            )
        return tuple(sorted(set(out))) or None

    def merge_knobs(
        self, base: dict[str, Any], entry: Mapping[str, Any], path: str, strategy: str, *, in_bucket: bool
    ) -> dict[str, Any]:
        """`base` overlaid with the valid knobs of `entry` (SGLang's `{**cfg, **entry}`: the bucket wins)."""
        knobs = dict(base)
        for raw_key, value in entry.items():
            key = str(raw_key)
            kpath = child_path(path, key)
            if key == "strategy":
                if in_bucket:
                    self.add(
                        "ADP210", "warning", kpath,
                        "strategy inside a bucket is ignored; SGLang reads strategy only at the top level",
                        "move strategy to the top level of the adaptive config",
                    )
                continue
            if key in EMA_KNOBS or key in THROUGHPUT_KEYS:
                if self.ignored_for_strategy(key, kpath, strategy):
                    continue
                if in_bucket and strategy == "throughput_aware":
                    self.add(
                        "ADP210", "warning", kpath,
                        f"{key} inside a bucket is ignored by strategy 'throughput_aware' "
                        "(it reads only candidate_steps per bucket)",
                        f"move {key} to the top level",
                    )
                    continue
                checked = self.knob(key, value, kpath)
                if checked is not None:
                    knobs[key] = checked
            elif in_bucket and key != "candidate_steps" and self.mode == "sglang":
                # Deployment files: unknown keys are the JSON Schema's to reject (SCH0xx), not ours.
                self.unknown_key(key, kpath, in_bucket=True)
        return knobs

    def oscillation(self, bucket: Bucket) -> None:
        k = bucket.knobs
        if k.strategy != "ema" or k.down_hysteresis <= k.up_hysteresis or len(bucket.candidate_steps) < 2:
            return
        self.add(
            "ADP218", "warning", bucket.path,
            f"bucket \"{bucket.key}\": down_hysteresis {k.down_hysteresis} > up_hysteresis {k.up_hysteresis}; an EMA "
            f"between step-0.5+{k.up_hysteresis} and step-0.5+{k.down_hysteresis} rises and drops again at every "
            "decision (the steps oscillate)",
            f"set down_hysteresis <= up_hysteresis in bucket \"{bucket.key}\" (SGLang's defaults are -0.25 and 0.0)",
        )

    def build(
        self, global_obj: Mapping[str, Any], entries: list[tuple[str, Any]], strategy: str
    ) -> AdaptiveConfig | None:
        base_knobs = dict(KNOB_DEFAULTS)
        if strategy == "throughput_aware":
            base_knobs["update_interval"] = 10  # throughput_aware_controller's own default
        base_knobs = self.merge_knobs(base_knobs, global_obj, self.base, strategy, in_bucket=False)
        base_knobs["strategy"] = strategy
        by_key: dict[int, Bucket] = {}
        first_key: dict[int, str] = {}
        for key, entry in entries:
            path = self.bucket_path(key)
            bs = self.bucket_key(key, path)
            steps = self.candidates(key, entry, path, strategy)
            if bs is None:
                continue
            if bs in first_key:
                self.add(
                    "ADP208", "error", path,
                    f'bucket keys "{first_key[bs]}" and "{key}" both mean batch size {bs}; SGLang keeps only '
                    f'the later one ("{key}") and silently drops the other',
                    f'merge them into one bucket "{bs}"',
                )
            first_key.setdefault(bs, key)
            if steps is None:
                by_key.pop(bs, None)
                continue
            knobs = self.merge_knobs(base_knobs, entry, path, strategy, in_bucket=True)
            knobs = {k: knobs[k] for k in KNOB_DEFAULTS}
            by_key[bs] = Bucket(min_batch_size=bs, candidate_steps=steps, knobs=Knobs(**knobs), key=key, path=path)
        if not entries:
            got = ", ".join(f'"{k}"' for k in global_obj) or "none"
            where = self.base if self.mode == "sglang" else f"{self.base}.buckets"
            self.add(
                "ADP201", "error", where,
                "the adaptive config has no batch-size bucket; SGLang needs at least one integer-string key, "
                f'e.g. {{"1": {{"candidate_steps": [1, 3, 7]}}}} (got keys: {got})',
                'add a bucket such as "1": {"candidate_steps": [1, 3, 5, 7]}',
            )
        if not by_key:
            return None
        buckets = tuple(by_key[k] for k in sorted(by_key))
        for b in buckets:
            self.oscillation(b)
        return AdaptiveConfig(buckets=buckets, strategy=strategy)


def parse_sglang_config(obj: Any, *, base_path: str = "$") -> tuple[AdaptiveConfig | None, list[Finding]]:
    """SGLang's `--speculative-adaptive-config` JSON object -> (config SGLang would run, findings)."""
    p = _Parser("sglang", base_path)
    if not isinstance(obj, Mapping):
        kind = "an array" if isinstance(obj, list) else _show(obj)
        p.add(
            "ADP219", "error", base_path,
            f"the adaptive config must be a JSON object, got {kind} (SGLang raises ValueError at start-up)",
            'write an object such as {"1": {"candidate_steps": [1, 3, 5, 7]}}',
        )
        return None, p.findings
    strategy = p.strategy(obj)
    p.unsupported_strategy(strategy)
    entries: list[tuple[str, Any]] = []
    for raw_key, value in obj.items():
        key = str(raw_key)
        if _DIGITS.fullmatch(key):
            entries.append((key, value))
        elif key != "strategy" and key not in EMA_KNOBS and key not in THROUGHPUT_KEYS:
            p.top_level_key(key)
    cfg = p.build(obj, entries, strategy)
    return cfg, p.findings


def parse_deployment_adaptive(
    section: Any, *, base_path: str = "$.speculative.adaptive"
) -> tuple[AdaptiveConfig | None, list[Finding]]:
    """A deployment's `speculative.adaptive` block -> (config, findings).

    Unknown keys of the block itself are the JSON Schema's to report (SCH0xx); everything semantic is
    checked here with the same codes as for SGLang files.
    """
    p = _Parser("deployment", base_path)
    if not isinstance(section, Mapping):
        p.add(
            "ADP219", "error", base_path,
            f"speculative.adaptive must be a mapping, got {_show(section)}",
            "write adaptive as a mapping with buckets, or remove it for fixed num_steps",
        )
        return None, p.findings
    strategy = p.strategy(section)
    p.unsupported_strategy(strategy)
    raw_buckets = section.get("buckets")
    entries: list[tuple[str, Any]] = []
    if isinstance(raw_buckets, Mapping):
        entries = [(str(k), v) for k, v in raw_buckets.items()]
    elif raw_buckets is not None:
        p.add(
            "ADP202", "error", f"{base_path}.buckets",
            f"buckets must be a mapping of batch size -> {{candidate_steps: [...]}}, got {_show(raw_buckets)}",
            "write buckets as a mapping, e.g. buckets: {1: {candidate_steps: [1, 3, 5, 7]}}",
        )
        return None, p.findings
    cfg = p.build(section, entries, strategy)
    return cfg, p.findings


# --------------------------------------------------------------------------------------------------
# Step coverage (DESIGN rule 1, ADP1xx)
# --------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class CoverageRow:
    """Batch sizes `batch_min..batch_max` (None: unbounded) pad to `padded_size` (None: no graph size is
    large enough, so they run unpadded) and route to `bucket` (None: fixed steps, no adaptive), where
    `steps` are selectable and a slot starts at `start_steps`."""

    batch_min: int
    batch_max: int | None
    padded_size: int | None
    bucket: int | None
    steps: tuple[int, ...]
    start_steps: int

    def to_json(self) -> dict[str, Any]:
        return {
            "batch_min": self.batch_min,
            "batch_max": self.batch_max,
            "padded_size": self.padded_size,
            "bucket": self.bucket,
            "steps": list(self.steps),
            "start_steps": self.start_steps,
        }


@dataclass(frozen=True)
class StepCoverage:
    """The reachable (batch size -> steps) table and the runtime states that must be prebuilt."""

    rows: tuple[CoverageRow, ...]
    required_states: tuple[int, ...]
    initial_steps: int
    # step -> the graph batch sizes at which it is selectable (SGLang captures graphs only there).
    graphs_by_step: tuple[tuple[int, tuple[int, ...]], ...] = ()
    unreachable_buckets: tuple[int, ...] = ()
    adaptive: bool = True

    def to_json(self) -> dict[str, Any]:
        return {
            "adaptive": self.adaptive,
            "initial_steps": self.initial_steps,
            "required_states": list(self.required_states),
            "graphs_by_step": {str(s): list(g) for s, g in self.graphs_by_step},
            "unreachable_buckets": list(self.unreachable_buckets),
            "rows": [r.to_json() for r in self.rows],
        }

    def render_text(self) -> str:
        head = ("batch size", "padded to", "bucket", "selectable steps", "starts at")
        body = []
        for r in self.rows:
            if r.batch_max is None:
                size = f"{r.batch_min}+"
            elif r.batch_max == r.batch_min:
                size = str(r.batch_min)
            else:
                size = f"{r.batch_min}-{r.batch_max}"
            padded = "-" if r.padded_size is None else str(r.padded_size)
            bucket = "fixed" if r.bucket is None else str(r.bucket)
            body.append((size, padded, bucket, ", ".join(map(str, r.steps)), str(r.start_steps)))
        widths = [max(len(row[i]) for row in (head, *body)) for i in range(len(head))]
        lines = ["  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip() for row in (head, *body)]
        lines.append(
            f"prebuilt runtime states (steps): {', '.join(map(str, self.required_states))}; "
            f"initial steps: {self.initial_steps}"
        )
        if self.unreachable_buckets:
            lines.append(f"unreachable buckets: {', '.join(map(str, self.unreachable_buckets))}")
        return "\n".join(lines)


def _segments(
    graphs: Sequence[int], keys: Sequence[int], max_batch_size: int | None
) -> list[tuple[int, int | None, int | None]]:
    """Batch-size ranges with one (padded size, bucket) each: (lo, hi or None, padded or None)."""
    segs: list[tuple[int, int | None, int | None]] = []
    lo = 1
    for g in sorted(set(graphs)):
        if g >= lo:
            segs.append((lo, g, g))
            lo = g + 1
    # Beyond the largest graph size batches run unpadded: split where a bucket starts.
    for k in sorted(set(keys)):
        if k > lo:
            segs.append((lo, k - 1, None))
            lo = k
    segs.append((lo, None, None))
    if max_batch_size is None:
        return segs
    out = []
    for lo, hi, padded in segs:
        if lo > max_batch_size:
            break
        out.append((lo, max_batch_size if hi is None or hi > max_batch_size else hi, padded))
    return out


def _clean_graphs(graph_batch_sizes: Sequence[int] | None) -> list[int]:
    # Malformed graph sizes are the deployment schema's to report; coverage uses the valid ones.
    return sorted({g for g in (graph_batch_sizes or ()) if _is_int(g) and g >= 1})


def _fixed_coverage(steps: int, graphs: Sequence[int], max_batch_size: int | None) -> StepCoverage:
    rows = tuple(
        CoverageRow(lo, hi, padded, None, (steps,), steps) for lo, hi, padded in _segments(graphs, (), max_batch_size)
    )
    used = tuple(sorted({r.padded_size for r in rows if r.padded_size is not None}))
    return StepCoverage(rows, (steps,), steps, ((steps, used),), (), adaptive=False)


def step_coverage(
    cfg: AdaptiveConfig,
    *,
    initial_steps: int | None,
    graph_batch_sizes: Sequence[int] = (),
    max_batch_size: int | None = None,
    base_path: str = "$",
    initial_steps_path: str | None = None,
    source: Mode = "sglang",
) -> tuple[StepCoverage, list[Finding]]:
    """Which steps the runtime can select, at which batch sizes, and the states to prebuild (rule 1).

    `base_path` is the path of the adaptive section (bucket paths come from the buckets themselves);
    `initial_steps_path` where the initial step is written (`$.speculative.num_steps`; defaults to
    `base_path` for SGLang files, whose initial step is a command-line flag). `source` names the
    settings in messages the way that input spells them (SGLang flags or deployment fields).
    """
    findings: list[Finding] = []
    if source == "sglang":
        init_name, graphs_name, max_bs_name = "--speculative-num-steps", "--cuda-graph-bs", "--max-running-requests"
    else:
        init_name, graphs_name, max_bs_name = "speculative.num_steps", "serve.graph_batch_sizes", "serve.max_batch_size"
    init_path = initial_steps_path or base_path
    union = cfg.union_steps
    if initial_steps is None:
        initial_steps = cfg.default_initial_steps
        findings.append(Finding(
            "ADP105", "info", init_path,
            f"no {init_name} given; SGLang starts at the middle of the candidate union {list(union)}: "
            f"{initial_steps}",
            (f"pass --initial-steps N (SGLang's {init_name}), N one of {list(union)}" if source == "sglang"
             else f"set {init_name} to one of {list(union)}"),
        ))
    graphs = _clean_graphs(graph_batch_sizes)
    if max_batch_size is not None and (not _is_int(max_batch_size) or max_batch_size < 1):
        max_batch_size = None
    rows: list[CoverageRow] = []
    for lo, hi, padded in _segments(graphs, cfg.keys, max_batch_size):
        b = cfg.route(lo, graphs)
        rows.append(CoverageRow(lo, hi, padded, b.min_batch_size, b.candidate_steps, b.start_steps(initial_steps)))
    reachable = {r.bucket for r in rows}
    unreachable = tuple(k for k in cfg.keys if k not in reachable)
    selectable = {initial_steps} | {s for b in cfg.buckets if b.min_batch_size in reachable for s in b.candidate_steps}
    graph_rows = [r for r in rows if r.padded_size is not None]
    graphs_by_step = tuple(
        (s, tuple(r.padded_size for r in graph_rows if s in r.steps)) for s in sorted(selectable)  # type: ignore[misc]
    )

    if initial_steps not in union:
        first = cfg.route(1, graphs)
        findings.append(Finding(
            "ADP101", "error", init_path,
            f"{init_name}={initial_steps} is not in the adaptive config candidate_steps {list(union)} "
            f"(SGLang refuses to start; an unbuilt step fails with 'Missing adaptive runtime state for "
            f"steps={initial_steps}')",
            f"set {init_name} to one of {list(union)} (SGLang's default is {cfg.default_initial_steps}), "
            f'or add {initial_steps} to candidate_steps of bucket "{first.key}"',
        ))
    for b in cfg.buckets:
        if b.min_batch_size in reachable:
            continue
        only_here = sorted(set(b.candidate_steps) - selectable)
        lost = (
            f"; steps {only_here} are selectable nowhere else, so their runtime states (SGLang prebuilds one per "
            "candidate) are never used"
            if only_here else ""
        )
        if max_batch_size is not None and b.min_batch_size > max_batch_size:
            findings.append(Finding(
                "ADP102", "warning", b.path,
                f'bucket "{b.key}" is unreachable: {max_bs_name} is {max_batch_size}, below its lower '
                f"bound {b.min_batch_size}{lost}",
                f'remove bucket "{b.key}", or raise {max_bs_name} to at least {b.min_batch_size}',
            ))
            continue
        nxt = [k for k in cfg.keys if k > b.min_batch_size]
        upper = nxt[0] - 1 if nxt else None
        pads = sorted({r.padded_size for r in rows if r.padded_size is not None
                       and r.batch_max is not None and r.batch_max >= b.min_batch_size
                       and (upper is None or r.batch_min <= upper)})
        span = f"{b.min_batch_size}..{upper}" if upper is not None else f"{b.min_batch_size} and above"
        if pads:
            why = (
                f"batch sizes {span} pad to graph size(s) {pads} of {graphs_name} {graphs}, "
                "which route to other buckets"
            )
            fix = f'add {b.min_batch_size} to {graphs_name} (any size in {span} works), or remove bucket "{b.key}"'
        else:
            why = "no batch size routes to it (a smaller key catches every size below the next bucket)"
            fix = f'remove bucket "{b.key}"'
        findings.append(Finding(
            "ADP103", "warning", b.path, f'bucket "{b.key}" is unreachable: {why}{lost}', fix,
        ))
    coverage = StepCoverage(
        rows=tuple(rows),
        required_states=tuple(sorted(selectable)),
        initial_steps=initial_steps,
        graphs_by_step=graphs_by_step,
        unreachable_buckets=unreachable,
        adaptive=True,
    )
    return coverage, findings


def check_deployment_steps(
    role: Mapping[str, Any],
    *,
    base_path: str = "$",
    adaptive_path: str | None = None,
    num_steps_path: str | None = None,
) -> tuple[StepCoverage | None, list[Finding]]:
    """Rules 1 and 2 for one merged role dict (`Deployment.role(...)`): bucket sanity findings of its
    `speculative.adaptive` block plus step coverage. Without `adaptive` the coverage is the fixed
    `num_steps` (0 for `algorithm: none`). Returns (None, findings) when no coverage can be computed.

    Paths default to `{base_path}.speculative.adaptive` / `.num_steps`; pass `adaptive_path` and
    `num_steps_path` where a role override wrote them (`$.roles.decode.speculative.adaptive`)."""
    spec = role.get("speculative") if isinstance(role.get("speculative"), Mapping) else {}
    serve = role.get("serve") if isinstance(role.get("serve"), Mapping) else {}
    assert isinstance(spec, Mapping) and isinstance(serve, Mapping)
    raw_graphs = serve.get("graph_batch_sizes")
    graphs = _clean_graphs(raw_graphs if isinstance(raw_graphs, list) else ())
    max_bs = serve.get("max_batch_size")
    max_bs = max_bs if _is_int(max_bs) and max_bs >= 1 else None
    num_steps = spec.get("num_steps")
    num_steps = num_steps if _is_int(num_steps) and num_steps >= 0 else None
    if spec.get("algorithm", "none") in (None, "none"):
        return _fixed_coverage(0, graphs, max_bs), []
    adaptive = spec.get("adaptive")
    if adaptive is None:
        if num_steps is None:
            return None, []  # the schema reports the missing/invalid num_steps
        return _fixed_coverage(num_steps, graphs, max_bs), []
    apath = adaptive_path or f"{base_path}.speculative.adaptive"
    cfg, findings = parse_deployment_adaptive(adaptive, base_path=apath)
    if cfg is None:
        return None, findings
    coverage, more = step_coverage(
        cfg,
        initial_steps=num_steps,
        graph_batch_sizes=graphs,
        max_batch_size=max_bs,
        base_path=apath,
        initial_steps_path=num_steps_path or f"{base_path}.speculative.num_steps",
        source="deployment",
    )
    return coverage, findings + more


# --------------------------------------------------------------------------------------------------
# Rule catalog (`specctl explain ADPnnn`)
# --------------------------------------------------------------------------------------------------

_BEFORE_101 = (
    '{"1": {"candidate_steps": [1, 3, 5, 7]}, "8": {"candidate_steps": [0, 1, 3]}}  + --speculative-num-steps 2'
)
_RULES = (
    RuleDoc(
        "ADP101", "initial step not among the candidates", "error",
        "The initial speculative steps (`--speculative-num-steps` / `speculative.num_steps`) must be in the union "
        "of all buckets' candidate_steps: runtime states are prebuilt only for candidates.",
        "ValueError: --speculative-num-steps=2 is not in the adaptive config candidate_steps [0, 1, 3, 5, 7]. "
        "Pass one of those values. (or, where unchecked, 'Missing adaptive runtime state for steps=2')",
        "Pass one of the candidates as the initial step, or add the initial step to a bucket's candidate_steps.",
        _BEFORE_101, "... + --speculative-num-steps 3",
    ),
    RuleDoc(
        "ADP102", "bucket above max_batch_size", "warning",
        "A bucket whose lower bound exceeds serve.max_batch_size can never be routed to; its steps are dead weight.",
        "None at start-up; the bucket's tuning silently never applies.",
        "Remove the bucket or raise serve.max_batch_size.",
        "max_batch_size: 32, buckets: {1: ..., 64: {candidate_steps: [0]}}", "buckets: {1: ..., 32: ...}",
    ),
    RuleDoc(
        "ADP103", "bucket unreachable after graph padding", "warning",
        "Batch sizes are padded up to the next graph batch size before routing; a bucket whose whole range pads "
        "to sizes owned by other buckets is never selected (only its padded sizes are reachable).",
        "None at start-up; the bucket's candidates and knobs silently never apply.",
        "Add a graph batch size inside the bucket's range, or remove the bucket.",
        "graph_batch_sizes: [1, 2, 4, 16], buckets: {1: ..., 8: ..., 16: ...}",
        "graph_batch_sizes: [1, 2, 4, 8, 16]",
    ),
    RuleDoc(
        "ADP105", "initial step defaulted", "info",
        "No initial step was given; SGLang uses the middle of the candidate union (union[len//2]).",
        "None.",
        "Pass the initial step explicitly.",
    ),
    RuleDoc(
        "ADP201", "no batch-size bucket", "error",
        "An adaptive config needs at least one integer-string batch-size key with candidate_steps.",
        "ValueError: speculative_adaptive_config must contain at least one integer-string BS key, "
        "e.g. {\"1\": {\"candidate_steps\": [1,3,7]}}.",
        "Add a bucket.",
        '{"ema_alpha": 0.3}', '{"ema_alpha": 0.3, "1": {"candidate_steps": [1, 3, 5]}}',
    ),
    RuleDoc(
        "ADP202", "bucket without a candidate list", "error",
        "Each bucket must be an object whose candidate_steps is a non-empty list.",
        "ValueError: BS 8: candidate_steps must be a list of non-negative ints, got None "
        "(AttributeError when the bucket is not an object).",
        "Write the bucket as {\"candidate_steps\": [...]}.",
        '"8": [0, 1, 3]', '"8": {"candidate_steps": [0, 1, 3]}',
    ),
    RuleDoc(
        "ADP203", "candidate step not a non-negative integer", "error",
        "Candidate steps are draft-step counts: integers >= 0 (>= 1 for throughput_aware). 0 means no speculation.",
        "ValueError: BS 1: candidate_steps must be a list of non-negative ints, got [1, -3]",
        "Use non-negative integers.",
        '"candidate_steps": [1, 2.5, -3]', '"candidate_steps": [1, 3]',
    ),
    RuleDoc(
        "ADP204", "boolean as a step", "error",
        "JSON true/false pass SGLang's int check and silently run as 1/0 steps.",
        "None at start-up; the bucket runs a step count nobody wrote.",
        "Write the number.",
        '"candidate_steps": [true, 3]', '"candidate_steps": [1, 3]',
    ),
    RuleDoc(
        "ADP205", "duplicate candidate steps", "warning",
        "SGLang de-duplicates candidate_steps; a repeated value usually hides a typo.",
        "None; the list is silently shortened.",
        "Write each step once.",
        '"candidate_steps": [1, 3, 3]', '"candidate_steps": [1, 3, 5]',
    ),
    RuleDoc(
        "ADP206", "malformed bucket key", "error",
        "Only digit-only keys are buckets. SGLang treats \"bs8\", \"-8\" or \"8.0\" as unknown global knobs and "
        "ignores them silently.",
        "None at start-up; the bucket you wrote never exists.",
        "Use the digit-only batch size as the key.",
        '"bs8": {"candidate_steps": [0, 1]}', '"8": {"candidate_steps": [0, 1]}',
    ),
    RuleDoc(
        "ADP207", "bucket key 0", "warning",
        "Batch sizes start at 1; a bucket 0 acts as the smallest bucket (or is unreachable next to bucket 1).",
        "None.",
        "Rename it to 1.",
        '"0": {...}', '"1": {...}',
    ),
    RuleDoc(
        "ADP208", "two keys for one bucket", "error",
        "\"8\" and \"08\" are the same batch size; SGLang keeps the later entry and drops the other silently.",
        "None at start-up; one bucket's settings vanish.",
        "Merge the entries.",
    ),
    RuleDoc(
        "ADP209", "unknown (misspelled) key", "error",
        "SGLang silently ignores keys it does not read, so a misspelled knob (\"ema_alfa\") never applies.",
        "None at start-up; the default value is used instead of yours.",
        "Rename the key to the knob it was meant to be.",
        '"ema_alfa": 0.5', '"ema_alpha": 0.5',
    ),
    RuleDoc(
        "ADP210", "key ignored by the chosen strategy", "warning",
        "Some keys are read only by one strategy (window_size by throughput_aware, hystereses by ema) or only "
        "at the top level (strategy).",
        "None; the setting silently has no effect.",
        "Remove the key or change the strategy.",
    ),
    RuleDoc(
        "ADP211", "update_interval < 1", "error",
        "Decisions happen every update_interval batches; it must be an integer >= 1.",
        "ZeroDivisionError: integer modulo by zero (update_interval 0) at the first decision after warm-up.",
        "Set update_interval to a positive integer.",
        '"update_interval": 0', '"update_interval": 5',
    ),
    RuleDoc(
        "ADP212", "ema_alpha outside (0, 1]", "error",
        "The EMA weight must satisfy 0 < ema_alpha <= 1: 0 never learns, above 1 diverges, negative oscillates.",
        "None at start-up; steps never move or move erratically.",
        "Use a value such as 0.2.",
        '"ema_alpha": 0', '"ema_alpha": 0.2',
    ),
    RuleDoc(
        "ADP213", "warmup_batches invalid", "error",
        "warmup_batches counts batches before the first decision; it must be an integer >= 0.",
        "None at start-up; a fractional or negative value shifts every decision.",
        "Use a non-negative integer.",
    ),
    RuleDoc(
        "ADP214", "knob of the wrong type", "error",
        "Hystereses must be finite numbers, ceiling_coeff a number >= 0, throughput_aware settings positive "
        "integers.",
        "TypeError in the decision arithmetic, or a silently disabled ceiling.",
        "Use a number of the documented range.",
    ),
    RuleDoc(
        "ADP215", "unknown strategy", "error",
        "strategy must be 'ema' (default) or 'throughput_aware'.",
        "ValueError: speculative adaptive config 'strategy' must be 'ema' or 'throughput_aware'",
        "Set strategy to ema.",
        '"strategy": "emma"', '"strategy": "ema"',
    ),
    RuleDoc(
        "ADP216", "throughput_aware in a specctl deployment", "error",
        "specctl's engine implements the EMA policy only; throughput_aware needs SGLang's start-up cost "
        "profiling of every (batch size, steps) pair.",
        "specctl serve/generate refuse to start with this deployment.",
        "Use strategy ema.",
    ),
    RuleDoc(
        "ADP217", "throughput_aware cannot be simulated", "warning",
        "The SGLang file is checked, but `specctl adaptive simulate` replays only the EMA policy.",
        "None.",
        "Use strategy ema to replay traces.",
    ),
    RuleDoc(
        "ADP218", "hysteresis band that oscillates", "warning",
        "With down_hysteresis > up_hysteresis an EMA inside the band rises above a step and drops back below it "
        "at the very next decision, so the steps flip every update_interval batches.",
        "None; throughput suffers from constant switching.",
        "Keep down_hysteresis <= up_hysteresis.",
        '"down_hysteresis": 0.2, "up_hysteresis": 0.0', '"down_hysteresis": -0.25, "up_hysteresis": 0.0',
    ),
    RuleDoc(
        "ADP219", "adaptive config is not an object", "error",
        "The adaptive config must be a JSON object (mapping).",
        "ValueError: speculative adaptive config must be a JSON object, got list",
        "Write an object of buckets and knobs.",
    ),
)
for _doc in _RULES:
    register(_doc)
