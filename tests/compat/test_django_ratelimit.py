"""django-ratelimit's documented idioms ported by changing imports answer as under
django-ratelimit: the sample of docs/migrating.md run by django-ratelimit and by
ratekeeper.compat.django_ratelimit side by side (each in a Django of its own), through Django's
test client and a real waitress, on memory (Django's local-memory cache for the peer) and on
Redis. Then the keys, settings and functions a port meets, in this process's Django."""

from __future__ import annotations

from typing import Any

import pytest

from tests.compat import ports
from tests.compat.django_side import compare
from tests.compat.side import statuses
from tests.integrations.django_project import setup

SAMPLE = ports.sample("django-ratelimit", 0)
RATELIMIT_VIEW = SAMPLE.replace(
    "MIDDLEWARE=[]",
    'MIDDLEWARE=["ratekeeper.compat.django_ratelimit.RatelimitMiddleware"], '
    'RATELIMIT_VIEW="__main__.too_many"',
).replace(
    "urlpatterns = [",
    "def too_many(request, exception):\n    return HttpResponse('slow down', status=429)\n\n\n"
    "urlpatterns = [",
)
REQUESTS = (
    [("GET", "/myview/", None)] * 6
    + [("GET", "/watched/", None)] * 6
    + [("POST", "/login/", {"username": "ann"})] * 6
    + [("GET", "/login/", {"username": "bob"})] * 2
    + [("GET", "/page/", None)] * 4
)
EDGES = [["127.0.0.1", 60], ["ann", 60], ["bob", 60]]


@pytest.fixture(params=["memory", "redis"])
def storage(request: pytest.FixtureRequest) -> str | None:
    return None if request.param == "memory" else request.getfixturevalue("redis_url")  # type: ignore[no-any-return]


@pytest.mark.parametrize("transport", ["client", "server"])
def test_the_sample_answers_as_under_django_ratelimit(transport: str, storage: str | None) -> None:
    theirs, ours = compare(SAMPLE, "django_ratelimit", REQUESTS, transport, storage, EDGES, (403,))
    assert ours == theirs
    assert statuses(ours)[:6] == [200] * 5 + [403]
    assert [a.status for a in ours[12:18]] == [200] * 5 + [403]
    assert [a.status for a in ours[-4:]] == [200, 200, 200, 403]  # method_decorator on a view


@pytest.mark.parametrize("transport", ["client", "server"])
def test_ratelimit_view_answers_through_the_middleware(transport: str, storage: str | None) -> None:
    requests = [("GET", "/myview/", None)] * 7
    theirs, ours = compare(
        RATELIMIT_VIEW, "django_ratelimit", requests, transport, storage, EDGES, (429,)
    )
    assert ours == theirs
    assert statuses(ours) == [200] * 5 + [429, 429] and ours[5].body == "slow down"


def test_the_port_differs_from_the_peers_app_only_in_imports() -> None:
    peer = ports.peer_source(SAMPLE)
    assert "ratekeeper" not in peer and "django_ratelimit" in peer
    assert ports.without_imports(peer) == ports.without_imports(SAMPLE)


# --- keys, settings and functions, in this process's Django (the tests' project)

setup()

from django.http import HttpRequest, HttpResponse  # noqa: E402
from django.test import RequestFactory, override_settings  # noqa: E402

from ratekeeper import ConfigError, ManualClock  # noqa: E402
from ratekeeper.compat import django_ratelimit as rl  # noqa: E402


def fresh(**config: Any) -> Any:
    return override_settings(RATEKEEPER={"CLOCK": ManualClock(), **config})


def view(request: HttpRequest) -> HttpResponse:
    return HttpResponse("ok")


def test_keys_count_as_django_ratelimit_counts_them() -> None:
    factory = RequestFactory()
    with fresh():
        anon = rl.ratelimit(key="user", rate="2/m", block=False)(view)
        ips = rl.ratelimit(key="ip", rate="1/m", block=False, group="v6")(view)

        def anonymous() -> HttpRequest:
            request = factory.get("/", REMOTE_ADDR=f"198.51.100.{len(seen)}")
            request.user = type("Anon", (), {"pk": None, "is_authenticated": False})()  # type: ignore[assignment]
            seen.append(request)
            return request

        seen: list[HttpRequest] = []
        for _ in range(3):
            anon(anonymous())
        assert [getattr(r, "limited", False) for r in seen] == [False, False, True]  # one bucket
        first = factory.get("/", REMOTE_ADDR="2001:db8::1")
        second = factory.get("/", REMOTE_ADDR="2001:db8::2")  # the same /64
        ips(first)
        ips(second)
        assert getattr(second, "limited", False) is True


def test_is_ratelimited_and_get_usage_read_the_decorators_counters() -> None:
    factory = RequestFactory()
    with fresh():
        limited = rl.ratelimit(group="g", key="ip", rate="3/m")(view)
        request = factory.get("/")
        for _ in range(2):
            limited(request)
        usage = rl.get_usage(request, group="g", key="ip", rate="3/m")
        assert usage is not None and usage["count"] == 2 and usage["limit"] == 3
        assert not usage["should_limit"] and 0 < usage["time_left"] <= 60
        assert rl.is_ratelimited(request, group="g", key="ip", rate="3/m", increment=True) is False
        assert rl.is_ratelimited(request, group="g", key="ip", rate="3/m", increment=True) is True
        with pytest.raises(rl.Ratelimited):
            limited(request)
        assert rl.get_usage(request, group="g", key="ip", rate="3/m", method="POST") is None
        with override_settings(RATELIMIT_ENABLE=False):
            assert rl.get_usage(request, group="g", key="ip", rate="3/m") is None
        assert rl.ALL == (None,) and "POST" in rl.UNSAFE and rl.ratelimit.UNSAFE is rl.UNSAFE  # type: ignore[attr-defined]


def test_one_group_with_two_rates_counts_each_rate_apart() -> None:
    factory = RequestFactory()
    with fresh():
        slow = rl.ratelimit(group="g2", key="ip", rate="1/m", block=False)(view)
        fast = rl.ratelimit(group="g2", key="ip", rate="3/m", block=False)(view)
        requests = [factory.get("/") for _ in range(3)]
        slow(requests[0])
        fast(requests[1])
        fast(requests[2])
        assert [getattr(r, "limited", False) for r in requests] == [False, False, False]


def test_settings_that_cannot_be_honoured_are_refused_naming_ours() -> None:
    for setting, named in [
        ({"RATELIMIT_USE_CACHE": "other"}, "STORAGE_URI"),
        ({"RATELIMIT_IP_META_KEY": "HTTP_X_REAL_IP"}, "TRUSTED_PROXIES"),
        ({"RATELIMIT_CACHE_PREFIX": "x:"}, "KEY_PREFIX"),
        ({"RATELIMIT_HASH_ALGORITHM": "hashlib.md5"}, "not hashed"),
        ({"RATELIMIT_FAIL_OPEN": False}, "fails open"),
    ]:
        with override_settings(**setting), pytest.raises(ConfigError, match=named):
            rl.ratelimit(key="ip", rate="1/m")
    with pytest.raises(ConfigError, match="needs a key"):
        rl.ratelimit(rate="1/m")
    with pytest.raises(ConfigError, match="rate '5/fortnight' is invalid"):
        rl.ratelimit(group="g", key="ip", rate="5/fortnight")
    with pytest.raises(ConfigError, match="key 'cookie:sid' is unknown"):
        rl.ratelimit(group="g", key="cookie:sid", rate="5/m")


def test_rate_and_key_functions_take_group_and_request() -> None:
    factory = RequestFactory()
    seen: list[tuple[str, str]] = []

    def rate(group: str, request: HttpRequest) -> str | None:
        seen.append((group, "rate"))
        return None if request.GET.get("vip") else "1/m"

    def key(group: str, request: HttpRequest) -> str:
        seen.append((group, "key"))
        return request.GET.get("who", "")

    with fresh():
        limited = rl.ratelimit(group="fn", key=key, rate=rate, block=False)(view)
        requests = [factory.get("/", {"who": "a"}) for _ in range(2)]
        for request in requests:
            limited(request)
        assert [getattr(r, "limited", False) for r in requests] == [False, True]
        vip = factory.get("/", {"who": "a", "vip": "1"})
        limited(vip)
        assert not getattr(vip, "limited", False)
        assert ("fn", "rate") in seen and ("fn", "key") in seen
