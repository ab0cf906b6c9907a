"""Orchestration: start and supervise the processes of a deployment (torch-free).

`ports` picks free loopback ports, `router` builds and runs the router's command line (smg or
sglang-router), `sglang_process` starts SGLang engines, and `launcher` (`specctl up`) starts every role,
gates the router on the live preflight, and stops everything it started.
"""
