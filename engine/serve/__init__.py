"""The serving layer: HTTP fronts (OpenAI + SGLang surface), per-role backends, launcher, metrics.

Dependencies point one way: serve -> pd -> core.
"""
