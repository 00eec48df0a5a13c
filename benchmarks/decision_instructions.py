"""Instructions per decision of the service's own code, counted by callgrind (repeatable on a
busy machine, where times are not).

The HTTP app (``POST /v1/hit``, with a receive/send that do nothing) and the gRPC servicer
(``ShouldRateLimit`` on a parsed request, its reply serialized) run in process on the memory
store; valgrind counts a run of ``--few`` and one of ``--many`` calls, and the difference
divided by the extra calls is the cost of one (start-up cancels out).

    python benchmarks/decision_instructions.py             # both paths, needs valgrind
    python benchmarks/decision_instructions.py --run http 1000   # what valgrind runs
"""

from __future__ import annotations

import argparse
import asyncio
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

CONFIG = """store: memory
policies:
  bench:
    rate: 1000000000/hour
domains:
  - domain: bench
    descriptors:
      - key: user
        rate_limit: {unit: hour, requests_per_unit: 1000000000}
"""


async def drive(path: str, calls: int, config: Path) -> None:
    from envoy.extensions.common.ratelimit.v3 import ratelimit_pb2 as common_pb
    from envoy.service.ratelimit.v3 import rls_pb2 as pb

    from ratekeeper.service.grpc_rls import RateLimitServicer
    from ratekeeper.service.server import ServeOptions, Service

    service = Service(ServeOptions((str(config),)))
    if path == "grpc":
        servicer = RateLimitServicer(service.envoy)
        entry = common_pb.RateLimitDescriptor.Entry(key="user", value="42")
        raw = pb.RateLimitRequest(
            domain="bench", descriptors=[common_pb.RateLimitDescriptor(entries=[entry])]
        ).SerializeToString()
        context: Any = None  # no auth configured: the servicer never reads it
        for _ in range(calls):
            reply = await servicer.should_rate_limit(pb.RateLimitRequest.FromString(raw), context)
            reply.SerializeToString()
        return
    body = b'{"policy":"bench","key":"user:42"}'
    scope = {
        "type": "http", "path": "/v1/hit", "method": "POST",
        "headers": [(b"content-type", b"application/json"), (b"content-length", b"34")],
    }  # fmt: skip
    message = {"type": "http.request", "body": body, "more_body": False}

    async def receive() -> dict[str, Any]:
        return message

    async def send(_: dict[str, Any]) -> None:
        return None

    for _ in range(calls):
        await service.api(scope, receive, send)


def run(path: str, calls: int) -> None:
    with tempfile.TemporaryDirectory() as work:
        config = Path(work) / "bench.yaml"
        config.write_text(CONFIG)
        try:
            import uvloop

            uvloop.run(drive(path, calls, config))
        except ImportError:
            asyncio.run(drive(path, calls, config))


def count(path: str, calls: int) -> int:
    out = subprocess.run(
        ["valgrind", "--tool=callgrind", "--callgrind-out-file=/dev/null", sys.executable,
         __file__, "--run", path, str(calls)],
        capture_output=True, text=True, check=True,
    ).stderr  # fmt: skip
    m = re.search(r"Collected : (\d+)", out)
    assert m is not None, out
    return int(m.group(1))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--run", nargs=2, metavar=("PATH", "CALLS"), help=argparse.SUPPRESS)
    parser.add_argument("--few", type=int, default=1000)
    parser.add_argument("--many", type=int, default=4000)
    args = parser.parse_args()
    if args.run:
        run(args.run[0], int(args.run[1]))
        return
    if shutil.which("valgrind") is None:
        raise SystemExit("valgrind is not installed (Debian: apt-get install valgrind)")
    for path in ("http", "grpc"):
        extra = count(path, args.many) - count(path, args.few)
        per = extra / (args.many - args.few)
        print(f"{path}: {per:,.0f} instructions per decision (memory store, in process)")


if __name__ == "__main__":
    main()
