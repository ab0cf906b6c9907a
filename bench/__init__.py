"""specctl bench: client-side load generation, metrics, reports and plots (no torch).

Works against any OpenAI-compatible server. The pieces, one noun per module:
`config` (BenchConfig, option parsers) -> `workload` (prompts) -> `arrivals` + `pacer` + `load`
(open/closed-loop load) -> `request` (one timed SSE request) -> `metrics` / `acceptance` /
`prometheus` (what was measured) -> `record` (the JSON record) -> `report` /
`plot` / `compare` (how it is shown). `runner.run_bench(config)` ties them together; `target`
launches a deployment for `specctl bench -c`; `stub_server` is a controllable fake server for
tests and benchmarks.
"""
