"""The ceilings of the service's stacks: the same servers with handlers that do nothing.

An empty unary ``ShouldRateLimit`` handler returning a fixed response, and an empty ASGI
route returning a fixed JSON decision, served exactly as ``ratekeeper serve`` serves
(``http_server.HttpServer`` with ``server.http_settings``, ``server.grpc_options`` and its
cap on calls at once, ``server.tune_process``, one uvloop event loop). The gRPC handler runs
on ``grpc.aio`` (``--grpc-threads 0``, the default, as ``ratekeeper serve``) or on the
standard ``grpc.server`` with that many handler threads.
``--inline``: the fixed decision is answered by the HTTP connection itself, as ``ratekeeper
serve`` answers its decision routes (``http.connection``), the ceiling of that path.
``bench_service.py`` runs these beside the service and divides.

    python benchmarks/empty_service.py --port 0 --grpc-port 0 [--inline]
"""

from __future__ import annotations

import argparse
import asyncio
import signal
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import grpc
from envoy.service.ratelimit.v3 import rls_pb2 as pb

from ratekeeper.errors import BadRequest
from ratekeeper.service.envoy.servicer import SERVICE
from ratekeeper.service.http.server import HttpServer
from ratekeeper.service.server import (
    GRPC_MAX_CALLS,
    ServeOptions,
    _listen,
    _loop_factory,
    freeze_heap,
    grpc_options,
    http_settings,
    tune_process,
)

BODY = (
    b'{"allowed":true,"limit":1000000000,"remaining":999999999,"reset_at":1800000000.0,'
    b'"retry_after":null,"policy":"bench","degraded":false,"shadow":false}'
)
HEADERS = [(b"content-type", b"application/json"), (b"content-length", b"%d" % len(BODY))]
RESPONSE = pb.RateLimitResponse(overall_code=pb.RateLimitResponse.OK)
RESPONSE.statuses.add(code=pb.RateLimitResponse.OK, limit_remaining=999_999_999)


async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
    """Reads the request body, answers the fixed decision."""
    if scope["type"] != "http":
        return
    await receive()
    await send({"type": "http.response.start", "status": 200, "headers": HEADERS})
    await send({"type": "http.response.body", "body": BODY})


class InlineApp:
    """``app``, with the fixed decision answered by the connection (``http.connection``)."""

    inline_paths = frozenset({"/v1/hit"})
    answer = (200, BODY, HEADERS)

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        await app(scope, receive, send)

    def check_head(self, method: str, path: str, head: Any) -> Any:
        return None

    def refuse(self, exc: BadRequest) -> Any:
        return exc.status, b"{}", [(b"content-length", b"2")]

    def decide_now(
        self, path: str, headers: Any, body: bytes, block: bool = False, soon: bool = False
    ) -> Any:
        return self.answer


async def should_rate_limit(request: Any, context: Any) -> Any:
    return RESPONSE


def should_rate_limit_sync(request: Any, context: Any) -> Any:
    return RESPONSE


async def main(options: ServeOptions, inline: bool = False) -> None:
    sock = _listen(options.host, options.port)
    threads = options.grpc_threads
    pool = ThreadPoolExecutor(threads) if threads else None
    server: Any
    if pool is None:
        server = grpc.aio.server(
            options=grpc_options(False), maximum_concurrent_rpcs=GRPC_MAX_CALLS
        )
    else:
        server = grpc.server(
            pool, options=grpc_options(False), maximum_concurrent_rpcs=GRPC_MAX_CALLS
        )
    method = grpc.unary_unary_rpc_method_handler(
        should_rate_limit if pool is None else should_rate_limit_sync,
        request_deserializer=pb.RateLimitRequest.FromString,
        response_serializer=pb.RateLimitResponse.SerializeToString,
    )
    server.add_generic_rpc_handlers(
        (grpc.method_handlers_generic_handler(SERVICE, {"ShouldRateLimit": method}),)
    )
    grpc_port = server.add_insecure_port(f"{options.host}:{options.grpc_port}")
    if pool is None:
        await server.start()
    else:
        server.start()
    front = InlineApp() if inline else None
    http = HttpServer(front or app, http_settings(options), front)
    await http.start(sock)
    stop = asyncio.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        asyncio.get_running_loop().add_signal_handler(sig, stop.set)
    port = sock.getsockname()[1]
    print(f"empty service on http://{options.host}:{port} and gRPC {grpc_port}", flush=True)
    freeze_heap()  # as ``ratekeeper serve`` does once serving
    try:
        await stop.wait()
        await http.shutdown(1.0)
    finally:
        if pool is None:
            await server.stop(grace=1.0)
        else:
            server.stop(1.0).wait()
            pool.shutdown(wait=False)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=0)
    parser.add_argument("--grpc-port", type=int, default=0)
    parser.add_argument(
        "--grpc-threads", type=int, default=0, help="0: grpc.aio; N: grpc.server, N threads"
    )
    parser.add_argument("--inline", action="store_true", help="HTTP answered by the protocol")
    args = parser.parse_args()
    opts = ServeOptions((), args.host, args.port, args.grpc_port, grpc_threads=args.grpc_threads)
    tune_process()
    with asyncio.Runner(loop_factory=_loop_factory()) as runner:
        runner.run(main(opts, args.inline))
