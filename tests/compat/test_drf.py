"""DRF's documented throttles ported by changing their paths answer as under DRF: the sample of
docs/migrating.md (the default anon and user throttles, a custom throttle written with
SimpleRateThrottle's idioms) run by DRF and by ratekeeper.compat.drf side by side, through
Django's test client and a real waitress, on memory (DRF: Django's local-memory cache) and on
Redis. Then the idioms a custom throttle uses, in this process's Django."""

from __future__ import annotations

from typing import Any

import pytest

from tests.compat import ports
from tests.compat.django_side import compare
from tests.compat.side import statuses
from tests.integrations.django_project import setup

SAMPLE = ports.sample("Django REST framework's throttles", 0)
REQUESTS = [("GET", "/items/", None)] * 4 + [("GET", "/search/", None)] * 3


@pytest.fixture(params=["memory", "redis"])
def storage(request: pytest.FixtureRequest) -> str | None:
    return None if request.param == "memory" else request.getfixturevalue("redis_url")  # type: ignore[no-any-return]


@pytest.mark.parametrize("transport", ["client", "server"])
def test_the_sample_answers_as_under_drf(transport: str, storage: str | None) -> None:
    theirs, ours = compare(SAMPLE, "drf", REQUESTS, transport, storage, bodies=(429,))
    assert ours == theirs
    assert statuses(ours) == [200, 200, 200, 429, 200, 200, 429]
    assert ours[3].body is not None and "Expected available in 60 seconds" in ours[3].body


def test_the_port_differs_from_drfs_app_only_in_the_class_paths() -> None:
    peer = ports.peer_source(SAMPLE)
    assert "ratekeeper" not in peer and "rest_framework.throttling" in peer
    assert ports.without_imports(peer).replace(
        "rest_framework.throttling", "X"
    ) == ports.without_imports(SAMPLE).replace("ratekeeper.compat.drf", "X")


# --- the idioms, in this process's Django (the tests' project)

setup()

from django.test import RequestFactory, override_settings  # noqa: E402
from rest_framework.request import Request  # noqa: E402

from ratekeeper import ConfigError, ManualClock  # noqa: E402
from ratekeeper.compat import drf  # noqa: E402


class Burst(drf.SimpleRateThrottle):
    scope = "burst"
    rate = "2/minute"

    def get_cache_key(self, request: Any, view: Any) -> str | None:
        return self.cache_format % {"scope": self.scope, "ident": self.get_ident(request)}


class Counting(Burst):
    successes = 0
    failures = 0

    def throttle_success(self) -> bool:
        type(self).successes += 1
        return super().throttle_success()

    def throttle_failure(self) -> bool:
        type(self).failures += 1
        return super().throttle_failure()


def drf_request() -> Request:
    return Request(RequestFactory().get("/", REMOTE_ADDR="203.0.113.9"))


def test_simple_rate_throttle_idioms() -> None:
    with override_settings(RATEKEEPER={"CLOCK": ManualClock(1_000.0)}):
        throttles = [Counting() for _ in range(3)]
        allowed = [t.allow_request(drf_request(), None) for t in throttles]
        assert allowed == [True, True, False]
        assert (Counting.successes, Counting.failures) == (2, 1)
        last = throttles[2]
        assert last.key == "throttle_burst_203.0.113.9" and last.num_requests == 2
        assert last.duration == 60 and isinstance(last.now, float)
        assert len(last.history) == 2 and last.wait() == 60.0
        assert len(throttles[1].history) == 2 and throttles[1].history[0] == throttles[1].now
        assert last.parse_rate("100/month") == (100, 60)  # DRF's reading of the unit
        assert drf.SimpleRateThrottle.cache is not None  # DRF's cache, for code that uses it


def test_num_proxies_is_refused_naming_ours() -> None:
    from rest_framework.settings import api_settings

    with override_settings(REST_FRAMEWORK={"NUM_PROXIES": 1}):
        api_settings.reload()
        try:
            with pytest.raises(ConfigError, match="TRUSTED_PROXIES"):
                Burst()
        finally:
            pass
    api_settings.reload()


def test_a_scope_served_at_two_rates_gets_two_checks() -> None:
    from ratekeeper.integrations import drf as native

    class Ours(native.RateThrottle):
        scope = "shared-scope"
        rate = "2/minute"

        def get_cache_key(self, request: Any, view: Any) -> str | None:
            return "same"

    class Theirs(Burst):
        scope = "shared-scope"
        rate = "3/minute"  # another rate under the same scope: no clash, counted apart

    with override_settings(RATEKEEPER={"CLOCK": ManualClock(1_000.0)}):
        assert [Ours().allow_request(drf_request(), None) for _ in range(3)] == [True, True, False]
        assert [Theirs().allow_request(drf_request(), None) for _ in range(4)] == [True] * 3 + [
            False
        ]
