"""``add_grpc_port``: a gRPC port that cannot be bound is refused by ratekeeper's message
alone, also where it is not probed first (a supervisor's worker): gRPC's C core writes its
own ``Failed to add port`` line to file descriptor 2, which must not reach the user."""

from __future__ import annotations

import socket
import subprocess
import sys

ADD = """\
import sys
from concurrent.futures import ThreadPoolExecutor
import grpc
from ratekeeper.errors import ConfigError
from ratekeeper.service.grpc_port import add_grpc_port

server = grpc.server(ThreadPoolExecutor(1))
try:
    port = add_grpc_port(server.add_insecure_port, "127.0.0.1", int(sys.argv[1]), shared=True)
except ConfigError as exc:
    print(exc)
    sys.exit(2)
print(f"bound {port}")
print("after the port was added", file=sys.stderr)
"""


def _add(port: int) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", ADD, str(port)], capture_output=True, text=True, timeout=60
    )


def test_a_port_in_use_gives_the_reason_and_no_c_core_line() -> None:
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        out = _add(port)
    assert out.returncode == 2, out
    assert out.stdout == (
        f"cannot listen for gRPC on 127.0.0.1:{port} (--grpc-port): Address already in use\n"
    )
    assert out.stderr == "", out.stderr  # gRPC's E... add_port.cc line was held and dropped


def test_a_free_port_is_added_and_stderr_works_after() -> None:
    out = _add(0)
    assert out.returncode == 0, out
    assert out.stdout.startswith("bound ") and int(out.stdout.split()[1]) > 0
    assert out.stderr == "after the port was added\n"
