"""The serving layer: HTTP fronts (OpenAI + SGLang surface), per-role backends, metrics.

Dependencies point one way: serve -> pd -> core.
"""
