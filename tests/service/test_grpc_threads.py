"""gRPC on the standard ``grpc.server`` (``--grpc-threads``): handler threads decide on the
memory store while the event loop serves HTTP on the same store, so every count is exact;
bytes that are not a ``RateLimitRequest`` are refused with ``INVALID_ARGUMENT`` (both servers);
a reload while handler threads resolve descriptors never leaves a stale resolution cached; a
handler thread waits for the event loop at most ``HOP_TIMEOUT``; the server chosen per store."""

from __future__ import annotations

import asyncio
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import httpx
import pytest
from envoy.extensions.common.ratelimit.v3 import ratelimit_pb2 as common_pb
from envoy.service.ratelimit.v3 import rls_pb2 as pb

from ratekeeper.service.envoy import servicer as grpc_rls
from ratekeeper.service.envoy.rls import Descriptor
from ratekeeper.service.envoy.servicer import SERVICE, ThreadServicer, on_loop, run_inline
from ratekeeper.service.server import ServeOptions, Service
from tests.service.proc import ServiceProcess

LIMIT = 300
CONFIG = f"""\
policies:
  shared:
    rate: {LIMIT}/hour
domains:
  - domain: edge
    descriptors:
      - key: user
        policy: shared
      - key: ip
        rate_limit: {{unit: hour, requests_per_unit: 5}}
"""
OK = pb.RateLimitResponse.OK
KEY = "[4:edge|4:user1:u"
"""The counter key of the descriptor ``user=u`` in domain ``edge``: HTTP names it directly."""


def request(**entries: str) -> bytes:
    descriptor = common_pb.RateLimitDescriptor(
        entries=[common_pb.RateLimitDescriptor.Entry(key=k, value=v) for k, v in entries.items()]
    )
    raw: bytes = pb.RateLimitRequest(domain="edge", descriptors=[descriptor]).SerializeToString()
    return raw


class _Context:
    """What ``ThreadServicer`` asks of a ``grpc.ServicerContext`` when nothing is refused."""

    def invocation_metadata(self) -> tuple[()]:
        return ()

    def abort(self, code: grpc.StatusCode, details: str) -> None:
        raise AssertionError(f"aborted: {code} {details}")


@pytest.fixture
def config_file(tmp_path: Path) -> Path:
    path = tmp_path / "ratekeeper.yaml"
    path.write_text(CONFIG)
    return path


@pytest.fixture
def fast_switching() -> Iterator[None]:
    """Switch threads every microsecond: a read-modify-write without a lock loses updates."""
    before = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)
    yield
    sys.setswitchinterval(before)


def test_handler_threads_and_http_on_the_loop_admit_exactly_the_limit(
    config_file: Path, fast_switching: None
) -> None:
    service = Service(ServeOptions(config_files=(str(config_file),), grpc_port=None))
    servicer = ThreadServicer(service.envoy, run_inline)
    raw = request(user="u")
    per_thread, grpc_threads, http_calls = 150, 4, 300
    admitted: list[bool] = []  # list.append is atomic
    errors: list[BaseException] = []

    def grpc_worker() -> None:
        try:
            for _ in range(per_thread):
                reply = pb.RateLimitResponse.FromString(servicer.should_rate_limit(raw, _Context()))  # type: ignore[arg-type]
                admitted.append(reply.overall_code == OK)
        except BaseException as exc:  # reported below
            errors.append(exc)

    async def http_calls_on_the_loop() -> None:
        transport = httpx.ASGITransport(app=service.api)
        async with httpx.AsyncClient(transport=transport, base_url="http://localhost") as client:
            for _ in range(http_calls):
                answer = await client.post("/v1/hit", json={"policy": "shared", "key": KEY})
                assert answer.status_code == 200, answer.text
                admitted.append(answer.json()["allowed"])

    def loop_worker() -> None:
        try:
            asyncio.run(http_calls_on_the_loop())
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=grpc_worker) for _ in range(grpc_threads)]
    threads.append(threading.Thread(target=loop_worker))
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert not errors, errors
    assert len(admitted) == grpc_threads * per_thread + http_calls
    assert sum(admitted) == LIMIT
    # Envoy's stats, counted by the handler threads at once, add up too
    total, over, _, within, _, _ = service.metrics.envoy.counts("edge", "edge.user", False)
    assert total == grpc_threads * per_thread
    assert within + over == total


def test_a_reload_during_a_resolution_is_not_cached_as_the_new_config(
    config_file: Path,
) -> None:
    """A handler thread resolving a descriptor from the config a reload is replacing must
    not leave that resolution cached for the new config, even when another thread has
    answered from the new config meanwhile."""
    service = Service(ServeOptions(config_files=(str(config_file),), grpc_port=None))
    envoy = service.envoy
    resolve = envoy._resolve
    new_config = CONFIG.replace("requests_per_unit: 5", "requests_per_unit: 7")
    ip = (Descriptor((("ip", "1.2.3.4"),)),)

    def resolve_while_reloading(*args: Any) -> Any:
        envoy._resolve = resolve  # type: ignore[method-assign]
        found = resolve(*args)  # resolved from the old config ...
        config_file.write_text(new_config)  # ... while the event loop reloads
        assert asyncio.run(service.reload()) is None
        other = (Descriptor((("ip", "5.6.7.8"),)),)  # and another thread answers
        assert run_inline(envoy.should_rate_limit("edge", other, 1)).statuses[0].limit
        return found

    envoy._resolve = resolve_while_reloading  # type: ignore[method-assign,assignment]
    first = run_inline(envoy.should_rate_limit("edge", ip, 1))
    assert first.statuses[0].limit is not None and first.statuses[0].limit[0] == 5
    second = run_inline(envoy.should_rate_limit("edge", ip, 1))
    assert second.statuses[0].limit is not None and second.statuses[0].limit[0] == 7


def test_a_coroutine_that_awaits_io_is_refused_inline() -> None:
    async def waits() -> None:
        await asyncio.get_running_loop().create_future()

    async def yields_bare() -> int:
        await asyncio.sleep(0)
        return 3

    assert run_inline(yields_bare()) == 3
    with pytest.raises(RuntimeError):  # no running loop: the coroutine fails at once
        run_inline(waits())


def test_many_grpc_clients_and_http_clients_on_a_real_service(config_file: Path) -> None:
    """The same through a real ``ratekeeper serve`` (4 handler threads): gRPC clients and
    HTTP clients at once on one key admit exactly the limit."""
    service = ServiceProcess(config_file, extra=("--grpc-threads", "4"))
    raw = request(user="u")
    admitted: list[bool] = []
    errors: list[BaseException] = []

    def grpc_client() -> None:
        try:
            with grpc.insecure_channel(f"127.0.0.1:{service.grpc_port}") as channel:
                call = channel.unary_unary(f"/{SERVICE}/ShouldRateLimit", None, None)
                for _ in range(100):
                    reply = pb.RateLimitResponse.FromString(call(raw, timeout=30))
                    admitted.append(reply.overall_code == OK)
        except BaseException as exc:
            errors.append(exc)

    def http_client() -> None:
        try:
            with httpx.Client(base_url=service.url, timeout=30) as client:
                for _ in range(100):
                    answer = client.post("/v1/hit", json={"policy": "shared", "key": KEY})
                    admitted.append(answer.json()["allowed"])
        except BaseException as exc:
            errors.append(exc)

    try:
        threads = [threading.Thread(target=grpc_client) for _ in range(4)]
        threads += [threading.Thread(target=http_client) for _ in range(2)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(180)
    finally:
        stderr = service.stop()
    assert not errors, errors
    assert len(admitted) == 600 and sum(admitted) == LIMIT
    assert "Traceback" not in stderr, stderr


NOT_A_REQUEST = [
    b"\xff\xff\xff",  # a corrupt tag
    b"\x0a\x02\xff\xfe",  # domain: bad UTF-8
    b"\x0a\x05ab",  # domain: truncated
    b"\x12\x03\x0a\x01",  # a descriptor: truncated
]


@pytest.mark.parametrize("threads", ["2", "0"])
def test_bytes_that_are_not_a_request_are_invalid_argument(config_file: Path, threads: str) -> None:
    service = ServiceProcess(config_file, extra=("--grpc-threads", threads))
    try:
        with grpc.insecure_channel(f"127.0.0.1:{service.grpc_port}") as channel:
            call = channel.unary_unary(f"/{SERVICE}/ShouldRateLimit", None, None)
            for raw in NOT_A_REQUEST:
                with pytest.raises(grpc.RpcError) as info:
                    call(raw, timeout=30)
                assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT, raw
                assert (info.value.details() or "").startswith("request: "), info.value.details()
            # still serving, nothing charged: the first of 5 leaves 4
            reply = pb.RateLimitResponse.FromString(call(request(ip="1.2.3.4"), timeout=30))
            assert reply.statuses[0].limit_remaining == 4
        metrics = httpx.get(f"{service.url}/metrics", timeout=30).text
        assert 'ratekeeper_requests_refused_total{reason="request"} 4.0' in metrics
    finally:
        stderr = service.stop()
    assert "Traceback" not in stderr, stderr


@pytest.mark.parametrize(
    ("store", "threads", "pool"),
    [
        ("store: memory\n", 0, None),  # the default, on every store: grpc.aio
        ("store: {url: 'redis://127.0.0.1:1/0'}\n", 0, None),
        ("store: {url: 'redis://127.0.0.1:1/0'}\n", 3, 3),
        ("store: memory\n", 2, 2),  # in process: handler threads decide
    ],
)
def test_the_grpc_server_by_store_and_grpc_threads(
    tmp_path: Path, store: str, threads: int, pool: int | None
) -> None:
    path = tmp_path / "ratekeeper.yaml"
    path.write_text(store + CONFIG)
    service = Service(ServeOptions((str(path),), grpc_threads=threads))

    async def build() -> Any:  # on a running loop, as ``serve`` builds it
        return service.grpc_server(asyncio.get_running_loop())

    server = asyncio.run(build())
    assert (server.pool._max_workers if server.pool else None) == pool
    assert isinstance(server.server, grpc.aio.Server) == (pool is None)
    if server.pool is not None:
        server.pool.shutdown()


def test_a_handler_thread_waits_for_the_loop_at_most_the_hop_timeout(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A loop that does not answer in time turns into ``TimeoutError`` (the servicer answers
    ``UNAVAILABLE``), and the call is cancelled on the loop."""
    monkeypatch.setattr(grpc_rls, "HOP_TIMEOUT", 0.05)
    loop = asyncio.new_event_loop()  # not running yet: nothing it is handed is answered
    finished: list[bool] = []

    async def decision() -> int:
        await asyncio.sleep(5)  # a store call that hangs
        finished.append(True)
        return 1

    try:
        with pytest.raises(TimeoutError):
            on_loop(loop)(decision())
        loop.run_until_complete(asyncio.sleep(0.05))  # the loop now runs what it was handed
        assert not asyncio.all_tasks(loop)  # ... and cancelled it
    finally:
        loop.close()
    assert finished == []


@pytest.mark.parametrize("threads", [0, 2])
def test_calls_past_the_cap_are_refused_at_once(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, fresh_redis: Any, threads: int
) -> None:
    """With Redis paused every call waits on the store; past ``GRPC_MAX_CALLS`` calls held at
    once, the next is refused with RESOURCE_EXHAUSTED instead of queueing (both servers)."""
    from ratekeeper.service import server as server_mod

    monkeypatch.setattr(server_mod, "GRPC_MAX_CALLS", 3)
    path = tmp_path / "ratekeeper.yaml"
    path.write_text(f"store: {{url: '{fresh_redis.url}', socket_timeout: 3}}\n" + CONFIG)
    service = Service(ServeOptions((str(path),), grpc_threads=threads))

    def call_many(port: int) -> list[grpc.StatusCode]:
        with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
            method = channel.unary_unary(f"/{SERVICE}/ShouldRateLimit")
            calls = [method.future(request(user=f"u{i}"), timeout=20) for i in range(8)]
            return [c.code() for c in calls]

    async def run() -> list[grpc.StatusCode]:
        server = service.grpc_server(asyncio.get_running_loop())
        port = server.add_insecure_port("127.0.0.1:0")
        await server.start()
        try:
            fresh_redis.pause()
            try:
                return await asyncio.to_thread(call_many, port)
            finally:
                fresh_redis.resume()
        finally:
            await server.stop(grace=1.0)

    codes = asyncio.run(run())
    refused = codes.count(grpc.StatusCode.RESOURCE_EXHAUSTED)
    assert refused >= 5, codes  # at most 3 held; the rest refused
    assert set(codes) <= {grpc.StatusCode.OK, grpc.StatusCode.RESOURCE_EXHAUSTED}, codes
