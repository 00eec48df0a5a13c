"""Instructions per decision of the service's own code, counted by callgrind (repeatable on a
busy machine, where times are not).

The HTTP app (``POST /v1/hit``, with a receive/send that do nothing) and the gRPC servicer
(``ShouldRateLimit`` on a parsed request, its reply serialized) run in process on the memory
store; valgrind counts a run of ``--few`` and one of ``--many`` calls, and the difference
divided by the extra calls is the cost of one (start-up cancels out).

    python benchmarks/decision_instructions.py             # both paths, needs valgrind
    python benchmarks/decision_instructions.py --run http 1000   # what valgrind runs

``--ceilings`` counts the stacks themselves the same way: ``empty_service.py`` runs under
valgrind while h2load sends it ``--many`` requests of each protocol on 32 connections (as
bench_service's closed loop), against a run that gets none, so the figure is the server's
own instructions per request (the kernel's are not counted). ``--served`` counts ``ratekeeper
serve`` so over HTTP, on the memory store and on a private ``redis-server``: the whole
server's instructions per decision, beside the empty route's.
"""

from __future__ import annotations

import argparse
import asyncio
import re
import shutil
import subprocess
import sys
import tempfile
from collections.abc import MutableMapping
from pathlib import Path
from typing import Any

from bench_service import CONFIG as POLICIES  # run as a script: benchmarks/ is on the path
from bench_service import Redis

CONFIG = "store: memory\n" + POLICIES


async def drive(path: str, calls: int, config: Path) -> None:
    from envoy.extensions.common.ratelimit.v3 import ratelimit_pb2 as common_pb
    from envoy.service.ratelimit.v3 import rls_pb2 as pb

    from ratekeeper.service.server import ServeOptions, Service

    service = Service(ServeOptions((str(config),)))
    if path.startswith("grpc"):
        from ratekeeper.service.envoy.servicer import RateLimitServicer, ThreadServicer, run_inline

        entry = common_pb.RateLimitDescriptor.Entry(key="user", value="42")
        raw = pb.RateLimitRequest(
            domain="bench", descriptors=[common_pb.RateLimitDescriptor(entries=[entry])]
        ).SerializeToString()
        context: Any = None  # no auth configured: the servicers never read it
        if path == "grpc-aio":
            servicer = RateLimitServicer(service.envoy)
            for _ in range(calls):
                await servicer.should_rate_limit(bytes(raw), context)
            return
        threads = ThreadServicer(service.envoy, run_inline)
        for _ in range(calls):  # what a handler thread does on the memory store
            threads.should_rate_limit(bytes(raw), context)
        return
    body = b'{"policy":"bench","key":"user:42"}'
    headers = [(b"content-type", b"application/json"), (b"content-length", b"34")]
    scope: dict[str, Any] = {
        "type": "http", "path": "/v1/hit", "method": "POST",
        "headers": headers,
    }  # fmt: skip
    message = {"type": "http.request", "body": body, "more_body": False}

    async def receive() -> dict[str, Any]:
        return message

    async def send(_: MutableMapping[str, Any]) -> None:
        return None

    if path == "http-inline":  # what the HTTP connection asks of the app (http_connection)
        decide_now = service.api.decide_now
        for _ in range(calls):
            decide_now("/v1/hit", headers, body, True)
        return
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


def ceiling(requests: int, api: str | None, served: str = "") -> int:
    """Instructions of ``empty_service.py`` (``served``: ``ratekeeper serve`` with that store
    config, the memory store's or a Redis one) under valgrind that answered ``requests``
    calls."""
    import signal
    import socket
    import struct
    import time

    ports = []
    for _ in range(2):
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            ports.append(s.getsockname()[1])
    work_dir = tempfile.TemporaryDirectory()
    work = work_dir.name
    if served:
        config = Path(work) / "bench.yaml"
        config.write_text(served + POLICIES)
        program = ["-m", "ratekeeper.cli", "serve", "--config", str(config)]
    else:
        program = [str(Path(__file__).with_name("empty_service.py"))]
    server = subprocess.Popen(
        ["valgrind", "--tool=callgrind", "--callgrind-out-file=/dev/null", sys.executable,
         *program, "--port", str(ports[0]), "--grpc-port", str(ports[1])],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    assert server.stdout is not None
    server.stdout.readline()  # its banner: listening
    with work_dir:
        body = Path(work) / "body"
        if api == "http":
            body.write_bytes(b'{"policy":"bench","key":"user:42"}')
            url = f"http://127.0.0.1:{ports[0]}/v1/hit"
            extra = ["--h1", "-H", "content-type:application/json"]
        else:
            from envoy.extensions.common.ratelimit.v3 import ratelimit_pb2 as common_pb
            from envoy.service.ratelimit.v3 import rls_pb2 as pb

            entry = common_pb.RateLimitDescriptor.Entry(key="user", value="42")
            raw = pb.RateLimitRequest(
                domain="bench", descriptors=[common_pb.RateLimitDescriptor(entries=[entry])]
            ).SerializeToString()
            body.write_bytes(b"\0" + struct.pack(">I", len(raw)) + raw)
            url = f"http://127.0.0.1:{ports[1]}/envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit"
            extra = ["-H", "content-type:application/grpc", "-H", "te:trailers"]
        if requests:
            clients = "32"  # as bench_service's closed loop
            subprocess.run(
                ["h2load", "-n", str(requests), "-c", clients, "-t", "1", *extra, "-d", str(body),
                 url],
                capture_output=True, check=True, timeout=600,
            )  # fmt: skip
    time.sleep(1)
    server.send_signal(signal.SIGINT)
    _, err = server.communicate(timeout=300)
    m = re.search(r"Collected : (\d+)", err)
    assert m is not None, err
    return int(m.group(1))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--run", nargs=2, metavar=("PATH", "CALLS"), help=argparse.SUPPRESS)
    parser.add_argument("--few", type=int, default=1000)
    parser.add_argument("--many", type=int, default=4000)
    parser.add_argument("--ceilings", action="store_true", help="count the empty servers too")
    parser.add_argument(
        "--served", action="store_true", help="count ratekeeper serve's HTTP decisions too"
    )
    parser.add_argument(
        "--paths",
        default="http-inline,http,grpc-aio,grpc",
        help="of http-inline (the protocol's call), http (through ASGI), grpc-aio, grpc (a "
        "handler thread's)",
    )
    args = parser.parse_args()
    if args.run:
        run(args.run[0], int(args.run[1]))
        return
    if shutil.which("valgrind") is None:
        raise SystemExit("valgrind is not installed (Debian: apt-get install valgrind)")
    if args.ceilings:
        idle = ceiling(0, None)
        for api in ("http", "grpc"):
            per = (ceiling(args.many, api) - idle) / args.many
            print(f"{api} ceiling: {per:,.0f} instructions per request (empty_service.py)")
    if args.served:
        stores = {"memory": "store: memory\n"}
        redis = Redis(Path(tempfile.mkdtemp())) if shutil.which("redis-server") else None
        if redis is not None:
            stores["redis"] = f"store:\n  url: {redis.url}\n  socket_timeout: 2.0\n"
        try:
            for name, store in stores.items():
                idle = ceiling(0, None, served=store)
                per = (ceiling(args.many, "http", served=store) - idle) / args.many
                print(
                    f"http served: {per:,.0f} instructions per decision (ratekeeper serve, {name})"
                )
        finally:
            if redis is not None:
                redis.stop()
    for path in args.paths.split(","):
        extra = count(path, args.many) - count(path, args.few)
        per = extra / (args.many - args.few)
        print(f"{path}: {per:,.0f} instructions per decision (memory store, in process)")


if __name__ == "__main__":
    main()
