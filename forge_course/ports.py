"""A TCP port for a rendezvous that another program is unlikely to take before it is used.

A port the kernel hands out for ``bind(("127.0.0.1", 0))`` comes from the ephemeral range, the
same range every outgoing connection takes its local port from. Between the moment the port is
found free and the moment the rendezvous binds it, one of those connections (another grading
worker's ranks, a browser) can take it: gloo's store then fails with EADDRINUSE. Ports below
the ephemeral range (Linux's starts at 32768, IANA's at 49152) are never handed out that way.
"""

from __future__ import annotations

import random
import socket

QUIET = range(20000, 32768)  # below every ephemeral range in use; above the registered few
_TRIES = 50
_CHOOSE = random.SystemRandom()  # the caller's seeded `random` is left as it was


def _bindable(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        try:
            probe.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def free_port() -> int:
    """A port on 127.0.0.1 that nobody holds now, outside the ephemeral range where one is
    found (else one the kernel picks)."""
    for port in _CHOOSE.sample(QUIET, _TRIES):
        if _bindable(port):
            return port
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]
