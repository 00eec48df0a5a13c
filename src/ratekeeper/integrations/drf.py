"""Django REST framework throttles on ratekeeper: drop-in for DRF's own, atomic on a shared store.

    REST_FRAMEWORK = {
        "DEFAULT_THROTTLE_CLASSES": ["ratekeeper.integrations.drf.UserRateThrottle"],
        "DEFAULT_THROTTLE_RATES": {"user": "1000/day", "anon": "100/hour"},
    }

They keep DRF's throttle contract — ``allow_request(request, view)`` and ``wait()`` — and its
scopes and rates (``scope``, ``rate``, ``DEFAULT_THROTTLE_RATES``, ``throttle_scope`` on a view,
``get_cache_key`` returning the client's identity or None), and decide with one atomic store
call per throttle, where DRF's cache throttles read a history, decide, then write it back (two
requests can both read "one left"). The store is ``settings.RATEKEEPER``'s (see
``ratekeeper.integrations.django``); the algorithm is ``sliding_log`` (DRF's own semantics:
at most N requests in any trailing period) unless a subclass says otherwise; the client's IP
comes from ``RATEKEEPER["TRUSTED_PROXIES"]``, not DRF's ``NUM_PROXIES``.

With ``ratekeeper``'s Django middleware installed, a throttle joins the request's admission:
its decision adds the rate-limit headers to the response, and a request refused by any check
charges none. The check of a throttle is named ``throttle:<scope>`` (``throttle:<scope>@<rate>``
for a second rate under one scope: a class that reads the rate otherwise).
"""

from __future__ import annotations

import dataclasses
from typing import Any

from django.core.exceptions import ImproperlyConfigured
from rest_framework.settings import api_settings

from ..decision import Decision
from ..errors import ConfigError
from ..middleware.checks import RateCheck
from ..middleware.gate import SCOPE_KEY, Admission
from ..middleware.request import RequestInfo
from ..middleware.responses import Rejection
from .django import LIMITS_KEY, current


@dataclasses.dataclass(frozen=True, slots=True)
class _Call:
    """``RequestInfo.raw`` of a throttle's check: DRF's request, the view, and the identity
    the throttle's ``get_cache_key`` gave."""

    request: Any
    view: Any
    ident: str


def _ident(request: RequestInfo) -> str:
    ident: str = request.raw.ident
    return ident


class RateThrottle:
    """DRF's ``SimpleRateThrottle`` contract on ratekeeper; subclasses give ``get_cache_key``
    and a ``scope`` (or a ``rate``)."""

    scope: str | None = None
    rate: str | None = None
    algorithm = "sliding_log"

    decision: Decision | None = None
    """The last call's decision (None before one, or when the check failed open)."""

    def __init__(self) -> None:
        if not getattr(self, "rate", None):
            self.rate = self.get_rate()
        self._rejection: Rejection | None = None

    def get_rate(self) -> str | None:
        """The rate of ``scope`` in ``DEFAULT_THROTTLE_RATES`` (None: no throttling)."""
        scope = getattr(self, "scope", None)
        if not scope:
            raise ImproperlyConfigured(
                f"You must set either `.scope` or `.rate` for {type(self).__name__!r} throttle"
            )
        rates: dict[str, Any] = api_settings.DEFAULT_THROTTLE_RATES
        try:
            rate: str | None = rates[scope]
        except KeyError:
            raise ImproperlyConfigured(
                f"No default throttle rate set for {self.scope!r} scope"
            ) from None
        return rate

    def get_cache_key(self, request: Any, view: Any) -> str | None:
        """Who is counted (a user id, an IP), or None not to throttle this request."""
        raise NotImplementedError(".get_cache_key() must be overridden")

    def get_ident(self, request: Any) -> str:
        """The client's IP, behind ``RATEKEEPER["TRUSTED_PROXIES"]``."""
        return current().info(request._request).client()

    def allow_request(self, request: Any, view: Any) -> bool:
        """Charge one request to this throttle's counter; False if over the rate."""
        self._rejection = None
        if self.rate is None:
            return True
        ident = self.get_cache_key(request, view)
        if ident is None:
            return True
        return self.decide(request, view, str(ident), self.rate) is None

    def decide(self, request: Any, view: Any, ident: str, rate: str) -> Rejection | None:
        """Charge ``request`` under ``ident`` at ``rate`` (the throttle's check), in the
        middleware's admission when it runs; the rejection, if any (``decision`` keeps the
        decision either way, None if the check could not decide)."""
        django_request = request._request
        started = django_request.META.get(SCOPE_KEY)  # the middleware's admission
        limits = django_request.META[LIMITS_KEY] if started is not None else current()
        name = f"throttle:{self.scope or type(self).__name__}"
        found = (name, rate, self.algorithm)
        position = limits.throttles.get(found)
        if position is None:
            check = RateCheck(name, rate, key=_ident, algorithm=self.algorithm)
            try:
                position = limits.gate.add(check)
            except ConfigError:  # the scope's name serves another rate: this one gets its own
                check = dataclasses.replace(check, name=f"{name}@{rate}")
                position = limits.gate.add(check)
            limits.throttles[found] = position
        base = limits.info(django_request)
        info = dataclasses.replace(base, raw=_Call(request, view, ident))
        adm = started or Admission(info)
        best = adm.best
        self._rejection = limits.sync.admit(info, adm, (position,))
        if started is None:  # nothing to refund or release later: done now
            limits.sync.finish(adm, None)
        if self._rejection is not None:
            self.decision = self._rejection.decision
        else:  # this check's decision, if it became the admission's best
            self.decision = adm.best[1] if adm.best is not best and adm.best else None
        return self._rejection

    def wait(self) -> float | None:
        """Seconds until a refused request could pass (``Retry-After``); None if never."""
        if self._rejection is None:
            return None
        retry = dict(self._rejection.headers).get("Retry-After")
        return None if retry is None else float(retry)


def _user_or_ip(throttle: RateThrottle, request: Any) -> str:
    user = getattr(request, "user", None)
    if user is not None and user.is_authenticated:
        return str(user.pk)
    return throttle.get_ident(request)


class AnonRateThrottle(RateThrottle):
    """Anonymous requests, by IP (scope ``anon``)."""

    scope = "anon"

    def get_cache_key(self, request: Any, view: Any) -> str | None:
        user = getattr(request, "user", None)
        if user is not None and user.is_authenticated:
            return None
        return self.get_ident(request)


class UserRateThrottle(RateThrottle):
    """Requests by user id, or by IP when anonymous (scope ``user``)."""

    scope = "user"

    def get_cache_key(self, request: Any, view: Any) -> str | None:
        return _user_or_ip(self, request)


class ScopedRateThrottle(RateThrottle):
    """The scope of the view (``throttle_scope``), by user id or IP; views without one are
    not throttled."""

    scope_attr = "throttle_scope"

    def __init__(self) -> None:
        self._rejection = None  # the rate depends on the view: read in allow_request

    def allow_request(self, request: Any, view: Any) -> bool:
        self.scope = getattr(view, self.scope_attr, None)
        if not self.scope:
            return True
        self.rate = self.get_rate()
        return super().allow_request(request, view)

    def get_cache_key(self, request: Any, view: Any) -> str | None:
        return _user_or_ip(self, request)
