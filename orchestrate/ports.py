"""Free ports for servers started here, chosen below the kernel's ephemeral range.

Contract: `free_port(host)` returns a TCP port that nothing on `host` listens on right now, drawn at random
from [PORT_FLOOR, the start of the ephemeral range) (Linux: /proc/sys/net/ipv4/ip_local_port_range, 32768
by default; elsewhere 32768), checked by binding it. Why not port 0: the kernel hands out a port of its
ephemeral range, the same range every outgoing connection takes its source port from. Between choosing the
port and the server binding it, a client socket (a bench request, a /health poll, the router's own
connections) could take it (a router then died with "Address already in use" in `bench --ab`), and a
poll of a port its server has not bound yet can connect to itself. Below the range no outgoing connection
ever lands. Torch-free.
"""

from __future__ import annotations

import random
import socket
from pathlib import Path

PORT_FLOOR = 10000
_EPHEMERAL_DEFAULT = 32768
_TRIES = 200


def ephemeral_start() -> int:
    """The first port of this machine's ephemeral range (32768 where it cannot be read)."""
    try:
        lo = int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return _EPHEMERAL_DEFAULT
    return lo if lo > PORT_FLOOR + 1000 else _EPHEMERAL_DEFAULT


def free_port(host: str = "127.0.0.1", taken: set[int] | None = None) -> int:
    """A port no socket on `host` is bound to now, below the ephemeral range and not in `taken`; falls back
    to one the kernel picks (port 0) if every try below the range is busy."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    hi = ephemeral_start()
    rng = random.SystemRandom()
    for _ in range(_TRIES):
        port = rng.randrange(PORT_FLOOR, hi)
        if taken is not None and port in taken:
            continue
        with socket.socket(family, socket.SOCK_STREAM) as s:
            try:
                s.bind((host, port))
            except OSError:
                continue
            return port
    with socket.socket(family, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


def free_ports(n: int, host: str = "127.0.0.1") -> list[int]:
    """`n` distinct ports from `free_port`, for a set of servers launched together."""
    chosen: list[int] = []
    for _ in range(n):
        chosen.append(free_port(host, set(chosen)))
    return chosen
