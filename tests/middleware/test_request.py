"""Key functions, priorities and path patterns: pure functions of a RequestInfo."""

from __future__ import annotations

from typing import Any

import pytest

from ratekeeper.errors import ConfigError
from ratekeeper.middleware import keys, priorities
from ratekeeper.middleware.request import PathMatcher, RequestInfo, from_environ, from_scope


def scope_request(peer: str | None, headers: dict[str, str], method: str = "GET") -> RequestInfo:
    raw = [(k.lower().encode(), v.encode()) for k, v in headers.items()]
    scope: dict[str, Any] = {"type": "http", "method": method, "path": "/x", "headers": raw}
    if peer is not None:
        scope["client"] = (peer, 1234)
    return from_scope(scope)


TRUSTED = ["10.0.0.0/8", "2001:db8::/32"]


@pytest.mark.parametrize(
    ("peer", "xff", "expected"),
    [
        ("203.0.113.9", "1.1.1.1", "203.0.113.9"),  # untrusted peer: a spoofed header is ignored
        ("10.0.0.1", "1.1.1.1", "1.1.1.1"),  # one trusted proxy
        ("10.0.0.1", "6.6.6.6, 1.1.1.1, 10.0.0.2", "1.1.1.1"),  # spoofed left part is skipped
        ("10.0.0.1", "10.0.0.3, 10.0.0.2", "10.0.0.3"),  # all trusted: the leftmost
        ("10.0.0.1", "not-an-ip, 1.1.1.1", "1.1.1.1"),
        ("10.0.0.1", "1.1.1.1, garbage", "10.0.0.1"),  # garbage from the hop: blame the hop
        ("10.0.0.1", "", "10.0.0.1"),
        ("10.0.0.1", "[2001:db9::1]:443", "2001:db9::1"),
        ("2001:db8::5", "1.1.1.1:5678", "1.1.1.1"),
    ],
)
def test_client_ip_honours_only_trusted_proxies(peer: str, xff: str, expected: str) -> None:
    key = keys.client_ip(trusted_proxies=TRUSTED)
    assert key(scope_request(peer, {"X-Forwarded-For": xff} if xff else {})) == expected


def test_client_ip_without_proxies_is_the_peer() -> None:
    key = keys.client_ip()
    assert key(scope_request("10.0.0.1", {"X-Forwarded-For": "1.1.1.1"})) == "10.0.0.1"
    assert key(scope_request(None, {})) == "unix"  # a Unix socket: one key, never skipped


def test_repeated_headers_are_joined_in_order() -> None:
    raw = [(b"x-forwarded-for", b"6.6.6.6"), (b"x-forwarded-for", b"1.1.1.1")]
    request = from_scope({"type": "http", "headers": raw, "client": ("10.0.0.1", 1)})
    assert keys.client_ip(TRUSTED)(request) == "1.1.1.1"


def test_bad_proxy_is_named() -> None:
    with pytest.raises(ConfigError, match=r"'10\.0\.0\.300'"):
        keys.client_ip(["10.0.0.300"])


def test_environ_request_and_key_functions() -> None:
    environ = {
        "REQUEST_METHOD": "POST",
        "PATH_INFO": "/pay",
        "REMOTE_ADDR": "10.0.0.1",
        "REMOTE_USER": "alice",
        "HTTP_X_API_KEY": "tok",
        "HTTP_X_FORWARDED_FOR": "1.1.1.1",
    }
    request = from_environ(environ)
    assert keys.header("X-Api-Key")(request) == "tok"
    assert keys.user()(request) == "alice"
    assert keys.path()(request) == "/pay"
    assert keys.client_ip(TRUSTED)(request) == "1.1.1.1"
    assert keys.first(keys.header("Authorization"), keys.constant("all"))(request) == "all"
    assert keys.header("Authorization")(request) is None


def test_scope_user_from_authentication_middleware() -> None:
    class User:
        is_authenticated = True
        identity = "u42"

    class Anonymous:
        is_authenticated = False

    base = {"type": "http", "headers": []}
    assert keys.user()(from_scope({**base, "user": User()})) == "u42"
    assert keys.user()(from_scope({**base, "user": Anonymous()})) is None
    assert keys.user()(from_scope(base)) is None


def test_priorities_follow_stripes_tiers() -> None:
    priority = priorities(
        critical=["/charges", "/refunds/*"],
        test_mode=lambda r: (r.header("authorization") or "").startswith("Bearer sk_test"),
    )
    assert priority(scope_request("1.1.1.1", {}, "POST")) == "post"
    assert priority(scope_request("1.1.1.1", {}, "GET")) == "get"
    test = scope_request("1.1.1.1", {"Authorization": "Bearer sk_test_1"}, "POST")
    assert priority(test) == "test"
    charge = from_scope({"type": "http", "method": "POST", "path": "/charges", "headers": []})
    assert priority(charge) == "critical"
    refund = from_scope({"type": "http", "method": "GET", "path": "/refunds/9", "headers": []})
    assert priority(refund) == "critical"


def test_path_matcher() -> None:
    match = PathMatcher(["/health", "/api/*/items", "/static/*"])
    assert match("/health") and match("/api/v1/items") and match("/static/a/b.css")
    assert not match("/healthz") and not match("/api/v1/users")
    with pytest.raises(ConfigError, match="'health'"):
        PathMatcher(["health"])
