"""Speculative decoding: drafters, verification, the adaptive-steps policy, verify traces and tuning.

Import-light: `specctl validate` imports the torch-free policy (`adaptive`) from here.
"""
