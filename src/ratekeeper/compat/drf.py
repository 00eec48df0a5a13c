"""Django REST framework's throttle classes on ratekeeper: port by changing imports.

    REST_FRAMEWORK = {
        "DEFAULT_THROTTLE_CLASSES": ["ratekeeper.compat.drf.AnonRateThrottle",
                                     "ratekeeper.compat.drf.UserRateThrottle"],
        "DEFAULT_THROTTLE_RATES": {"anon": "100/day", "user": "1000/day"},
    }

    class BurstRateThrottle(SimpleRateThrottle):     # from ratekeeper.compat.drf
        scope = "burst"
        def get_cache_key(self, request, view):
            return self.cache_format % {"scope": self.scope, "ident": self.get_ident(request)}

What maps onto what: ``SimpleRateThrottle`` keeps DRF's idioms — ``cache_format``, ``cache``,
``timer``, ``THROTTLE_RATES``, ``get_rate``, ``parse_rate`` (DRF's reading: the first letter of
the unit, so ``"100/month"`` is 100 a minute, as under DRF), ``num_requests``, ``duration``,
``key``, ``now``, ``history``, ``throttle_success``/``throttle_failure``, ``wait`` — and
decides each request with the integration's atomic throttle (``RateThrottle.decide``: one store
call, ``sliding_log``, DRF's semantics) instead of DRF's read-decide-write of a cache entry, so
concurrent requests never over-admit. ``get_cache_key`` returns what DRF's returns; it is the
counted identity. After a decision, ``history`` holds as many entries as requests counted in
the window, newest first: the newest is ``now``, the oldest when the oldest counted request
was made (on a refusal, what ``wait()`` reads); the times between are not kept. ``cache`` is
DRF's (Django's default cache) for code that uses it itself; ratekeeper never does.

DRF's ``NUM_PROXIES`` is refused: set ``RATEKEEPER["TRUSTED_PROXIES"]`` instead.
"""

from __future__ import annotations

import time
from typing import Any

from django.core.cache import cache as default_cache
from django.core.exceptions import ImproperlyConfigured
from rest_framework.settings import api_settings

from ..errors import ConfigError
from ..integrations import drf as integration

__all__ = ["AnonRateThrottle", "ScopedRateThrottle", "SimpleRateThrottle", "UserRateThrottle"]

_PERIODS = {"s": 1, "m": 60, "h": 3600, "d": 86_400}


class _Rates:
    """``THROTTLE_RATES`` read when used (DRF reads it when its module is imported, which
    needs Django's settings by then); a subclass may still set its own dict."""

    def __get__(self, obj: object, owner: type | None = None) -> dict[str, Any]:
        rates: dict[str, Any] = api_settings.DEFAULT_THROTTLE_RATES
        return rates


class SimpleRateThrottle(integration.RateThrottle):
    """DRF's ``SimpleRateThrottle``, decided by ratekeeper (see the module docstring)."""

    cache: Any = default_cache
    timer = time.time
    cache_format = "throttle_%(scope)s_%(ident)s"
    THROTTLE_RATES: Any = _Rates()

    def __init__(self) -> None:
        if api_settings.NUM_PROXIES is not None:
            raise ConfigError(
                "DRF's NUM_PROXIES is not supported: set settings.RATEKEEPER['TRUSTED_PROXIES'] "
                "to your proxies' addresses"
            )
        if not getattr(self, "rate", None):
            self.rate = self.get_rate()
        self.num_requests, self.duration = self.parse_rate(self.rate)
        self._rejection = None
        self.history: list[float] = []

    def get_rate(self) -> str | None:
        """The rate of ``scope`` in ``THROTTLE_RATES``, as DRF reads it."""
        if not getattr(self, "scope", None):
            raise ImproperlyConfigured(
                f"You must set either `.scope` or `.rate` for '{type(self).__name__}' throttle"
            )
        scope = str(self.scope)
        try:
            rate: str | None = self.THROTTLE_RATES[scope]
        except KeyError:
            raise ImproperlyConfigured(
                f"No default throttle rate set for '{self.scope}' scope"
            ) from None
        return rate

    def parse_rate(self, rate: str | None) -> tuple[int | None, int | None]:
        """DRF's ``(requests, seconds)`` of a rate: the unit's first letter decides."""
        if rate is None:
            return (None, None)
        num, period = rate.split("/")
        return int(num), _PERIODS[period[0]]

    def allow_request(self, request: Any, view: Any) -> bool:
        """Decide the request (one atomic store call); ``throttle_success`` or
        ``throttle_failure`` answers, as in DRF."""
        if self.rate is None:
            return True
        self.key = self.get_cache_key(request, view)
        if self.key is None:
            return True
        self.now = self.timer()  # type: ignore[misc]  # DRF's idiom: a function or a method
        rate = f"{self.num_requests}/{self.duration}s"
        rejection = self.decide(request, view, str(self.key), rate)
        self.history = self._history(rejection is None)
        return self.throttle_success() if rejection is None else self.throttle_failure()

    def _history(self, allowed: bool) -> list[float]:
        decision = self.decision
        if decision is None or self.duration is None:
            return [self.now] if allowed else []
        count = decision.limit - decision.remaining
        if allowed:
            oldest = self.now if count <= 1 else decision.reset_at - self.duration
            return [self.now] + [oldest] * (count - 1)
        oldest = self.now + decision.retry_after - self.duration
        return [oldest] * count

    def throttle_success(self) -> bool:
        """Called when the request is admitted (already counted)."""
        return True

    def throttle_failure(self) -> bool:
        """Called when the request is throttled."""
        return False


class AnonRateThrottle(SimpleRateThrottle):
    """Anonymous requests, by IP (scope ``anon``); authenticated ones are not throttled."""

    scope = "anon"

    def get_cache_key(self, request: Any, view: Any) -> str | None:
        if request.user and request.user.is_authenticated:
            return None
        return self.cache_format % {"scope": self.scope, "ident": self.get_ident(request)}


class UserRateThrottle(SimpleRateThrottle):
    """Requests by user id, or by IP when anonymous (scope ``user``)."""

    scope = "user"

    def get_cache_key(self, request: Any, view: Any) -> str | None:
        if request.user and request.user.is_authenticated:
            ident = request.user.pk
        else:
            ident = self.get_ident(request)
        return self.cache_format % {"scope": self.scope, "ident": ident}


class ScopedRateThrottle(SimpleRateThrottle):
    """The view's ``throttle_scope``, by user id or IP; views without one are not throttled."""

    scope_attr = "throttle_scope"

    def __init__(self) -> None:
        self._rejection = None  # the rate depends on the view: read in allow_request
        self.history = []

    def allow_request(self, request: Any, view: Any) -> bool:
        self.scope = getattr(view, self.scope_attr, None)
        if not self.scope:
            return True
        self.rate = self.get_rate()
        self.num_requests, self.duration = self.parse_rate(self.rate)
        return super().allow_request(request, view)

    def get_cache_key(self, request: Any, view: Any) -> str | None:
        if request.user and request.user.is_authenticated:
            ident = request.user.pk
        else:
            ident = self.get_ident(request)
        return self.cache_format % {"scope": self.scope, "ident": ident}
