"""Adaptive speculative steps, the rule catalog: one `RuleDoc` per ADP code for `specctl explain`.
(Split out of `schemas/adaptive.py`, which re-exports everything.)
"""

from __future__ import annotations

from specctl.schemas.catalog import RuleDoc, register

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
        "integers; specctl's zero_backoff an integer >= 1 and zero_threshold a number >= 0 (or null).",
        "TypeError in the decision arithmetic, or a silently disabled ceiling.",
        "Use a number of the documented range.",
    ),
    RuleDoc(
        "ADP215", "unknown strategy", "error",
        "A deployment's speculative.adaptive.strategy must be 'ema' (the default).",
        "specctl serve/generate refuse to start with this deployment.",
        "Set strategy to ema, or remove it.",
        "strategy: emma", "strategy: ema",
    ),
    RuleDoc(
        "ADP216", "throughput_aware in a deployment", "error",
        "No engine runs a 'throughput_aware' policy: specctl's engine implements the EMA policy only, and SGLang's "
        "adaptive loader has no strategy key (every release up to 0.5.23 ignores it and runs EMA).",
        "specctl serve/generate refuse to start; an SGLang server silently runs EMA instead.",
        "Use strategy ema (or remove the key).",
        "strategy: throughput_aware", "strategy: ema",
    ),
    RuleDoc(
        "ADP222", "strategy key in an SGLang adaptive JSON", "warning",
        "SGLang's adaptive loader reads the digit-string bucket keys and the EMA knobs; it has no strategy key, so "
        "any value there is silently ignored and the EMA policy runs.",
        "None: the EMA policy runs, whatever strategy says.",
        "Remove \"strategy\" from the file.",
        '{"strategy": "throughput_aware", "1": {"candidate_steps": [1, 3]}}', '{"1": {"candidate_steps": [1, 3]}}',
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
    RuleDoc(
        "ADP220", "specctl-only knob in an SGLang adaptive JSON", "warning",
        "zero_backoff and zero_threshold are read only by specctl's policy. SGLang's loader merges {**cfg, **entry} "
        "and never reads them, so the file runs under SGLang as if the key were absent (a bucket at steps 0 probes "
        "at every decision; a bucket steps down to 0 only at an EMA <= 0.5 + down_hysteresis); specctl reads an "
        "SGLang file the way SGLang does, so its simulation ignores the key too.",
        "None; the back-off or the separate bar to 0 silently never happens.",
        "Remove the key from the SGLang JSON; run the knob from a deployment file with engine: builtin.",
        '{"zero_backoff": 16, "1": {"candidate_steps": [0, 1, 3]}}', '{"1": {"candidate_steps": [0, 1, 3]}}',
    ),
    RuleDoc(
        "ADP221", "specctl-only knob with engine: sglang", "error",
        "A deployment whose engine is sglang runs SGLang servers from the exported adaptive JSON, which cannot carry "
        "zero_backoff or zero_threshold (SGLang ignores the key): the policy would differ from what the deployment "
        "says and what `specctl adaptive tune` predicted.",
        "None at start-up under SGLang (the knob silently never applies); specctl's commands that load the "
        "deployment (`up`, `serve`, `export sglang`) refuse it as invalid.",
        "Remove zero_backoff (or set it to 1, SGLang's behaviour) and zero_threshold, or use engine: builtin; "
        "`specctl adaptive tune --sglang` finds the best config SGLang can run.",
        "engine: sglang\nspeculative: {adaptive: {zero_backoff: 16, buckets: {...}}}",
        "engine: builtin\nspeculative: {adaptive: {zero_backoff: 16, buckets: {...}}}",
    ),
)
for _doc in _RULES:
    register(_doc)

