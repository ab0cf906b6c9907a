"""Adaptive speculative decoding as a tool (torch-free): the steps policy, trace formats, tuning.

`policy` is the adaptive-steps controller the engine runs and `specctl adaptive simulate` replays;
`trace` is the per-verify and per-request trace format, `sglang_trace` converts what SGLang servers
report into it; `tune` chooses a config by counterfactual replay of a trace against a cost model.
"""
