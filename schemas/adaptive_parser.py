"""Adaptive speculative steps, parsing: SGLang's adaptive JSON and a deployment's `speculative.adaptive`
block -> `AdaptiveConfig` plus every bucket-sanity finding (ADP2xx). Never raises for bad content.
(Split out of `schemas/adaptive.py`, which re-exports everything.)
"""

from __future__ import annotations

import difflib
import re
from collections.abc import Mapping
from typing import Any

from specctl.schemas.adaptive_config import (
    _DEPLOYMENT_KEYS,
    _DIGITS,
    _KNOWN_KEYS,
    _SIMPLE_KEY,
    EMA_KNOBS,
    KNOB_DEFAULTS,
    SGLANG_DEFAULT_CONFIG,
    SPECCTL_KNOB_DEFAULTS,
    SPECCTL_KNOB_UNDER_SGLANG,
    SPECCTL_KNOBS,
    STRATEGIES,
    THROUGHPUT_KEYS,
    AdaptiveConfig,
    Bucket,
    Knobs,
    Mode,
    _is_int,
    _is_number,
    _show,
)
from specctl.schemas.findings import Finding, Severity

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
            return self._valid(
                _is_number(value) and 0 < value <= 1, value,
                "ADP212", path,
                f"ema_alpha is {_show(value)}; it must be a number with 0 < ema_alpha <= 1 "
                "(0 freezes the EMA; above 1 it overshoots every observation)",
                "set ema_alpha to a number in (0, 1], e.g. 0.2 (SGLang's default)",
            )
        if name == "update_interval":
            why = " (SGLang divides by it: ZeroDivisionError at the first decision)" if value == 0 else ""
            return self._valid(
                _is_int(value) and value >= 1, value,
                "ADP211", path,
                f"update_interval is {_show(value)}; it must be an integer >= 1{why}",
                "set update_interval to a positive integer, e.g. 5 (SGLang's default)",
            )
        if name == "warmup_batches":
            return self._valid(
                _is_int(value) and value >= 0, value,
                "ADP213", path,
                f"warmup_batches is {_show(value)}; it must be an integer >= 0",
                "set warmup_batches to a non-negative integer, e.g. 10 (SGLang's default)",
            )
        if name in ("down_hysteresis", "up_hysteresis"):
            return self._valid(
                _is_number(value), value,
                "ADP214", path,
                f"{name} is {_show(value)}; it must be a finite number",
                f"set {name} to a number, e.g. {KNOB_DEFAULTS[name]} (SGLang's default)",
            )
        if name == "ceiling_coeff":
            return self._valid(
                _is_number(value) and value >= 0, value,
                "ADP214", path,
                f"ceiling_coeff is {_show(value)}; it must be a finite number >= 0 (0 disables the ceiling)",
                "set ceiling_coeff to 0 (off) or a positive number",
            )
        if name == "zero_backoff":
            return self._valid(
                _is_int(value) and value >= 1, value,
                "ADP214", path,
                f"zero_backoff is {_show(value)}; it must be an integer >= 1: the longest stay at steps 0, in "
                "decision intervals, after repeated failed probes (1 = SGLang: probe at every decision)",
                "set zero_backoff to 1 (off, SGLang's behaviour) or a cap such as 16",
            )
        if name == "zero_threshold":
            return self._valid(
                _is_number(value) and value >= 0, value,
                "ADP214", path,
                f"zero_threshold is {_show(value)}; it must be a finite number >= 0: the EMA of accepted drafts at "
                "or below which the bucket steps down to 0 (null = SGLang's bar, 0.5 + down_hysteresis)",
                "set zero_threshold to a number such as 0.5, or remove it (SGLang's behaviour)",
            )
        if name in THROUGHPUT_KEYS:
            ok = value is None if name.startswith(("profile_run_batch", "max_profile", "profile_run_seq")) else False
            if name == "profile_run_batch_sizes" and isinstance(value, list):
                ok = all(_is_int(v) and v >= 1 for v in value)
            elif _is_int(value):
                ok = value >= (0 if name == "profile_run_n_warmup" else 1)
            return self._valid(
                ok, value,
                "ADP214", path,
                f"{name} is {_show(value)}; throughput_aware needs a positive integer here"
                + (" (or a list of them)" if name == "profile_run_batch_sizes" else ""),
                f"set {name} to a positive integer or remove it to use SGLang's default",
            )
        return None

    def _valid(self, ok: bool, value: Any, code: str, path: str, message: str, fix: str) -> Any | None:
        """`value` when `ok`, else None after recording the finding (`knob`'s every branch)."""
        if ok:
            return value
        self.add(code, "error", path, message, fix)
        return None

    def strategy(self, obj: Mapping[str, Any]) -> str:
        """The policy that runs. SGLang's loader has no `strategy` key (it reads digit keys and the EMA knobs),
        so in an SGLang file any value is ignored and EMA runs; a deployment may name only `ema`."""
        if "strategy" not in obj:
            return "ema"
        value = obj["strategy"]
        if self.mode == "sglang":
            if value == "ema":
                return "ema"  # ignored by SGLang, and what runs anyway
            self.add(
                "ADP222", "warning", f"{self.base}.strategy",
                f"strategy is {_show(value)}, but SGLang's adaptive loader has no strategy key: it is silently "
                "ignored and the EMA policy runs with this file's buckets and EMA knobs",
                'remove "strategy"; the EMA knobs (ema_alpha, update_interval, ...) are what SGLang reads',
            )
            return "ema"
        if value in STRATEGIES:
            return str(value)
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
        self.add(
            "ADP216", "error", f"{self.base}.strategy",
            "strategy is 'throughput_aware', a policy no engine runs: specctl's engine implements only 'ema', and "
            "SGLang's adaptive loader has no strategy key (an exported config would silently run EMA)",
            'set strategy to "ema" (or remove it)',
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

    def specctl_only_in_sglang(self, key: str, value: Any, path: str) -> None:
        """A specctl-only knob in an SGLang adaptive JSON: SGLang's loader never reads it."""
        default = SPECCTL_KNOB_DEFAULTS[key]
        effect = (
            f"{key} {_show(value)} is SGLang's behaviour anyway" if value == default
            else f"under SGLang {SPECCTL_KNOB_UNDER_SGLANG[key]}, as if it were absent"
        )
        self.add(
            "ADP220", "warning", path,
            f"{key} is a specctl-only knob; SGLang ignores the key ({effect}). specctl reads this file as "
            "SGLang does, so `specctl adaptive simulate` of it ignores the key too",
            f"remove {key} from the SGLang JSON; to run it, put it in a deployment's speculative.adaptive "
            "with engine: builtin (`specctl adaptive tune --sglang` searches only what SGLang can run)",
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
                        "strategy inside a bucket is ignored: neither SGLang nor specctl reads it there",
                        "remove strategy from the bucket",
                    )
                continue
            if key in SPECCTL_KNOBS:
                if self.mode == "sglang":
                    # SGLang never reads it, so the config SGLang runs (which this parser returns) lacks it.
                    self.specctl_only_in_sglang(key, value, kpath)
                    continue
                if value is None and SPECCTL_KNOB_DEFAULTS[key] is None:
                    knobs[key] = None  # explicitly SGLang's behaviour (a bucket can undo a global setting)
                    continue
                checked = self.knob(key, value, kpath)
                if checked is not None:
                    knobs[key] = checked
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
        base_knobs = {**KNOB_DEFAULTS, **SPECCTL_KNOB_DEFAULTS}
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
            knobs = {k: knobs[k] for k in (*KNOB_DEFAULTS, *SPECCTL_KNOBS)}
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


def specctl_only_settings(adaptive: Any) -> list[tuple[tuple[str, ...], str, Any]]:
    """(keys under speculative.adaptive, knob, value) of every specctl-only knob a deployment's adaptive
    block sets away from its default (SGLang's behaviour): what an SGLang engine cannot run."""
    if not isinstance(adaptive, Mapping):
        return []
    buckets = adaptive.get("buckets")
    places: list[tuple[tuple[str, ...], Any]] = [((), adaptive)]
    if isinstance(buckets, Mapping):
        places += [(("buckets", str(key)), entry) for key, entry in buckets.items()]
    return [(keys, knob, entry[knob]) for keys, entry in places if isinstance(entry, Mapping)
            for knob, default in SPECCTL_KNOB_DEFAULTS.items() if knob in entry and entry[knob] != default]


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
        elif key != "strategy" and key not in (*EMA_KNOBS, *THROUGHPUT_KEYS, *SPECCTL_KNOBS):
            p.top_level_key(key)
    cfg = p.build(obj, entries, strategy)
    return cfg, p.findings


def sglang_default_config() -> AdaptiveConfig:
    """SGLang's DEFAULT_ADAPTIVE_CONFIG (what SGLang runs when no config file is passed), parsed."""
    cfg, findings = parse_sglang_config(SGLANG_DEFAULT_CONFIG)
    assert cfg is not None and not findings, findings
    return cfg


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


