"""gRPC's listening port, added so that a port in use is refused by ratekeeper's message alone.

Before ``add_insecure_port`` fails, gRPC's C core writes its own line (``E1203 ...
add_port.cc:83] Failed to add port to server: ...``) to the process's stderr, and the
exception it raises then says only "set GRPC_VERBOSITY=debug". A service that cannot start
should print one clear line naming the address, the flag and the reason. So the port is
probed first (a bind without ``SO_REUSEPORT``, the reason the OS's, as the HTTP port's), and
while gRPC adds it, file descriptor 2 is held in a temporary file: written out unchanged when
the port is added, and read for the reason (never printed) when it is not.
"""

from __future__ import annotations

import os
import re
import socket
import tempfile
from collections.abc import Callable

from ..errors import ConfigError

_REASON = re.compile(r"Error in bind for address '[^']*': ([^)]+)\)")


def add_grpc_port(add: Callable[[str], int], host: str, port: int, shared: bool) -> int:
    """``add(host:port)`` (a gRPC server's ``add_insecure_port``): the port bound, or a
    ``ConfigError`` naming the address, ``--grpc-port`` and the reason. ``shared``: a worker
    of a supervisor, which has already reserved the port (no probe: its bind would fail)."""
    where = f"[{host}]:{port}" if ":" in host and not host.startswith("[") else f"{host}:{port}"
    if port and not shared:
        reason = _probe(host, port)
        if reason:
            raise ConfigError(f"cannot listen for gRPC on {where} (--grpc-port): {reason}")
    with tempfile.TemporaryFile() as held:
        saved = os.dup(2)
        os.dup2(held.fileno(), 2)
        try:
            bound = add(where)
            failure = None
        except RuntimeError as exc:
            failure = exc
        finally:
            os.dup2(saved, 2)
            os.close(saved)
        held.seek(0)
        said = held.read()
    if failure is None:
        if said:
            os.write(2, said)
        return bound
    found = _REASON.search(said.decode(errors="replace"))
    reason = found[1] if found else str(failure).split(";")[0]
    raise ConfigError(f"cannot listen for gRPC on {where} (--grpc-port): {reason}") from None


def _probe(host: str, port: int) -> str:
    """Why ``host:port`` cannot be listened on (the OS's words), or "" when it can."""
    try:
        family, kind, proto, _, address = socket.getaddrinfo(
            host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE
        )[0]
        with socket.socket(family, kind, proto) as probe:
            probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            probe.bind(address)
    except OSError as exc:
        return exc.strerror or str(exc)
    return ""
