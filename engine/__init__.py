"""The runtime: model, caches, scheduler, speculative decoding, PD transfer, HTTP server.

This package's __init__ must stay import-light (no torch): torch-free modules such as the adaptive
policy live here and are imported by `specctl validate`.
"""
