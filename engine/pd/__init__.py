"""The PD plane: typed wire messages, registration and the verifying handshake, KV/state transfer.

Depends on the engine core only; the serving layer (`specctl.engine.serve`) builds on it.
"""
