"""The runtime: model, caches, scheduler (the engine core, this folder), speculative decoding (speculative/), the PD
plane (pd/) and the serving layer (serve/). See docs/architecture.md.

This package's __init__ must stay import-light (no torch): torch-free modules such as the adaptive
policy live here and are imported by `specctl validate`.
"""
