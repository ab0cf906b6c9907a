"""The engine's speculative runtime: drafters, verification and the decoder that runs them.

The adaptive-steps policy it follows and the trace format it writes live in the torch-free
`specctl.adaptive` package; `profile` measures this runtime's step costs for `specctl adaptive tune`.
"""
