"""``keys.client_ip`` behind proxies and on Unix sockets, and ``trusted_proxies`` set once on
the middleware for every check: no check is silently skipped, no two clients behind a trusted
proxy share a key."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from starlette.testclient import TestClient

from ratekeeper import ManualClock, MemoryStore
from ratekeeper.middleware import (
    ConcurrencyCheck,
    RateCheck,
    RateLimitMiddleware,
    WSGIRateLimitMiddleware,
    keys,
)
from ratekeeper.middleware.request import from_environ, from_scope


def _environ(peer: str, forwarded: str | None = None) -> dict[str, Any]:
    env = {"REQUEST_METHOD": "GET", "PATH_INFO": "/", "REMOTE_ADDR": peer}
    if forwarded is not None:
        env["HTTP_X_FORWARDED_FOR"] = forwarded
    return env


def _scope(client: tuple[str, int] | None, forwarded: str | None = None) -> dict[str, Any]:
    headers = [] if forwarded is None else [(b"x-forwarded-for", forwarded.encode())]
    return {"type": "http", "method": "GET", "path": "/", "headers": headers, "client": client}


async def _ok(scope: Any, receive: Any, send: Any) -> None:
    await send({"type": "http.response.start", "status": 200, "headers": []})
    await send({"type": "http.response.body", "body": b"ok"})


def _asgi_statuses(mw: RateLimitMiddleware, scopes: list[dict[str, Any]]) -> list[int]:
    async def one(scope: dict[str, Any]) -> int:
        sent: list[Any] = []

        async def receive() -> dict[str, Any]:
            return {"type": "http.request", "body": b""}

        async def send(message: Any) -> None:
            sent.append(message)

        await mw(scope, receive, send)
        return int(sent[0]["status"])

    async def main() -> list[int]:
        return [await one(s) for s in scopes]

    return asyncio.run(main())


def test_asgi_on_a_unix_socket_is_limited_not_skipped() -> None:
    # uvicorn --uds gives client=None: the key used to be None and the check skipped
    mw = RateLimitMiddleware(_ok, [RateCheck("api", "5/minute")], clock=ManualClock())
    statuses = _asgi_statuses(mw, [_scope(None)] * 8)
    assert statuses == [200] * 5 + [429] * 3
    assert mw.stats()["checks"]["api"]["rejected"] == 3


def test_asgi_unix_socket_behind_a_trusted_proxy_keys_each_client() -> None:
    mw = RateLimitMiddleware(
        _ok, [RateCheck("api", "1/minute")], clock=ManualClock(), trusted_proxies=["10.0.0.0/8"]
    )
    scopes = [_scope(None, f"198.51.100.{i}, 10.0.0.2") for i in range(5)]
    assert _asgi_statuses(mw, scopes) == [200] * 5  # five clients, five keys
    assert _asgi_statuses(mw, scopes[:1]) == [429]


def test_wsgi_socket_path_peer_trusts_forwarded_for_from_the_local_proxy() -> None:
    # gunicorn on a Unix socket puts the socket path in REMOTE_ADDR
    info = from_environ(_environ("/run/app.sock", "203.0.113.9"), _nets("10.0.0.0/8"))
    assert info.client() == "203.0.113.9"
    assert keys.client_ip(["10.0.0.0/8"])(info) == "203.0.113.9"
    # without trusted proxies it is one counter for the socket, never a skipped check
    assert keys.client_ip()(from_environ(_environ("/run/app.sock", "203.0.113.9"))) == "unix"
    assert keys.client_ip()(from_environ(_environ(""))) == "unix"


def test_ipv4_mapped_proxy_address_matches_an_ipv4_range() -> None:
    nets = _nets("10.0.0.0/8")
    info = from_scope(_scope(("::ffff:10.0.0.1", 1), "198.51.100.7"), nets)
    assert info.client() == "198.51.100.7"  # the dual-stack proxy is trusted
    mapped_client = from_scope(_scope(("::ffff:198.51.100.7", 1)), nets)
    assert mapped_client.client() == "198.51.100.7"  # one key for both spellings
    assert keys.client_ip()(from_scope(_scope(("::FFFF:198.51.100.7", 1)))) == "198.51.100.7"
    spoofed = from_scope(_scope(("::ffff:198.51.100.7", 1), "1.1.1.1"), nets)
    assert spoofed.client() == "198.51.100.7"  # an untrusted peer's header is ignored


@pytest.mark.parametrize("flavour", ["asgi", "wsgi"])
def test_trusted_proxies_set_once_apply_to_every_default_key(flavour: str) -> None:
    """25 clients through one load balancer, a cap of 20 concurrent per client: every one is
    admitted (before, the default key counted the balancer: 20 admitted, 5 refused)."""
    store = MemoryStore()
    checks = [RateCheck("per-ip", "100/minute"), ConcurrencyCheck("concurrent", 20)]
    options: dict[str, Any] = {"store": store, "clock": ManualClock()}
    options["trusted_proxies"] = ["10.0.0.0/8"]
    held = []
    if flavour == "asgi":
        gate = asyncio.Event()

        async def app(scope: Any, receive: Any, send: Any) -> None:
            await gate.wait()
            await _ok(scope, receive, send)

        mw = RateLimitMiddleware(app, checks, **options)

        async def main() -> list[int]:
            async def one(i: int) -> int:
                sent: list[Any] = []

                async def receive() -> dict[str, Any]:
                    return {"type": "http.request", "body": b""}

                async def send(message: Any) -> None:
                    sent.append(message)

                await mw(_scope(("10.1.2.3", 1), f"198.51.100.{i}"), receive, send)
                return int(sent[0]["status"])

            tasks = [asyncio.create_task(one(i)) for i in range(25)]
            await asyncio.sleep(0.05)
            gate.set()
            return list(await asyncio.gather(*tasks))

        statuses = asyncio.run(main())
    else:
        wsgi = WSGIRateLimitMiddleware(_wsgi_ok, checks, **options)
        statuses = []
        for i in range(25):  # each response kept open: its slot stays held
            started: list[str] = []
            body = wsgi(_environ("10.1.2.3", f"198.51.100.{i}"), _recorder(started))
            held.append(body)
            statuses.append(int(started[0][:3]))
    assert statuses == [200] * 25
    assert store.count_leases("concurrent:198.51.100.0", 0) in (0, 1)
    for body in held:
        body.close()  # type: ignore[attr-defined]  # the middleware's iterable has close()


def _recorder(into: list[str]) -> Any:
    return lambda status, headers: into.append(status)


def _wsgi_ok(environ: Any, start_response: Any) -> list[bytes]:
    start_response("200 OK", [])
    return [b"ok"]


def _nets(*cidrs: str) -> Any:
    from ratekeeper.middleware.request import trusted_networks

    return trusted_networks(cidrs)


def test_default_key_without_trusted_proxies_ignores_forwarded_for() -> None:
    client = TestClient(
        RateLimitMiddleware(_ok, [RateCheck("api", "1/minute")], clock=ManualClock()),
        client=("10.1.2.3", 1),
    )
    assert client.get("/", headers={"x-forwarded-for": "1.1.1.1"}).status_code == 200
    assert client.get("/", headers={"x-forwarded-for": "2.2.2.2"}).status_code == 429
