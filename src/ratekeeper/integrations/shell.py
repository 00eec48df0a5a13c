"""What the FastAPI and Flask shells share: their options, the decorators, and options given in
code resolved against the framework's settings (code wins)."""

from __future__ import annotations

import dataclasses
import itertools
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any, TypeVar

from ..clock import Clock
from ..metrics.core import Metrics
from ..middleware.checks import (
    ChargeWhen,
    Check,
    CheckLevel,
    Controls,
    CostFunc,
    RateFunc,
    RateSpec,
)
from ..middleware.gate import check_on_error
from ..middleware.request import KeyFunc, PriorityFunc, client_ip
from ..plan import make_policy
from .nested_routes import NestedLimit, nested_limit
from .routes import Limit, RouteTable, as_limits
from .settings import Settings

F = TypeVar("F")


@dataclass(frozen=True, slots=True)
class Resolved:
    """Options for one app: the default and application limits, key and algorithm of its
    routes, its controls, and the keyword arguments of its middleware."""

    default: tuple[Limit, ...]
    key: KeyFunc
    algorithm: str
    middleware: dict[str, Any]
    application: tuple[Limit, ...] = ()
    controls: Controls | None = None


class Shell:
    """Options and decorators of a framework's ``RouteLimits``.

    ``default``: limits for every route without its own (a rate, a stack, or a list);
    ``application``: limits every route walks besides its own, one counter for the whole app
    (per key), named ``application`` (``application#2``, ...) unless a ``Limit`` names one;
    ``key``: the default key function (the client's IP, believing ``X-Forwarded-For`` only
    from ``trusted_proxies``); ``algorithm``: of limits that name none; ``checks``: app-wide
    checks run before routing for every request (load shedding, concurrency); ``exempt``:
    paths no check sees; ``charge_when(status)``: which responses are charged (default: all
    but 304); ``on_breach``: builds the response to a rejection (the framework says with what
    arguments). ``store``, ``clock``, ``controls``, ``priority``, ``log_interval`` and
    ``metrics`` and ``on_error`` are ``RateLimitMiddleware``'s. ``None`` means: from the
    framework's settings, else the default.

    ``controls`` given here is shared by every app the object serves; without it each app gets
    its own (its settings' mode), so one app's ``ENABLED``/``MODE`` and counters never leak
    into another's — ``controls`` is then the one of the app last initialized (Flask:
    ``controls_of(app)``).
    """

    def __init__(
        self,
        *,
        default: str | Limit | Iterable[str | Limit] | None = None,
        key: KeyFunc | None = None,
        algorithm: str | None = None,
        trusted_proxies: Iterable[str] | None = None,
        checks: Iterable[Check] = (),
        store: Any = None,
        clock: Clock = time.time,
        controls: Controls | None = None,
        exempt: Iterable[str] = (),
        priority: PriorityFunc | None = None,
        charge_when: ChargeWhen | None = None,
        on_breach: Callable[..., Any] | None = None,
        log_interval: float = 60.0,
        metrics: Metrics | None = None,
        application: str | Limit | Iterable[str | Limit] | None = None,
        on_error: str | None = None,
    ) -> None:
        self.table = RouteTable()
        self.on_breach = on_breach
        self.serial = itertools.count(1)
        """Numbers for limits that have neither a name nor a decorated view (dependencies)."""
        self._default = None if default is None else as_limits(default)
        self._application = _named(as_limits(application), "application")
        self._key = key
        if algorithm is not None:
            make_policy("1/1s", algorithm, None, None)  # an unknown algorithm fails here
        self._algorithm = algorithm
        self._on_error = None if on_error is None else check_on_error(on_error)
        self._trusted_proxies = None if trusted_proxies is None else tuple(trusted_proxies)
        self._own_controls = controls is not None
        self._resolved = False
        self.controls = Controls() if controls is None else controls
        self._middleware_options: dict[str, Any] = {
            "checks": list(checks),
            "store": store,
            "clock": clock,
            "controls": self.controls,
            "exempt": exempt,
            "priority": priority,
            "charge_when": charge_when,
            "log_interval": log_interval,
            "metrics": metrics,
        }

    def resolve(self, settings: Settings) -> Resolved:
        """This shell's options for an app with ``settings`` (with controls of its own unless
        the shell was given some)."""
        default = settings.default if self._default is None else self._default
        application = self._application or _named(settings.application, "application")
        algorithm = self._algorithm or settings.strategy
        proxies = self._trusted_proxies
        key = self._key or client_ip()  # behind the middleware's trusted proxies
        for limit in (*default, *application):
            limit.bind("default", key, algorithm)  # an option that does not fit fails now
        controls = self.controls
        if not self._own_controls:  # the first app keeps the object made here (modes set on
            if self._resolved:  # it before init_app stay), later apps get their own
                controls = self.controls = Controls()
            controls.default = settings.mode
        self._resolved = True
        middleware = dict(self._middleware_options)
        middleware["controls"] = controls
        middleware["trusted_proxies"] = settings.trusted_proxies if proxies is None else proxies
        middleware["on_error"] = self._on_error or settings.on_error
        if middleware["store"] is None:
            middleware["store"] = settings.store()
        return Resolved(default, key, algorithm, middleware, application, controls)

    def limit(
        self,
        rate: RateSpec | RateFunc,
        *,
        key: KeyFunc | None = None,
        cost: int | CostFunc = 1,
        algorithm: str | None = None,
        burst: int | None = None,
        buckets: int | None = None,
        methods: Iterable[str] = (),
        charge_when: ChargeWhen | None = None,
        override_defaults: bool = True,
        message: str | None = None,
    ) -> Callable[[F], F]:
        """Decorate a view (or a group of views) with a limit counted per route. ``rate`` may
        be a function of the request returning the rate, or None for no limit; ``message``
        replaces the 429's message."""
        limit = Limit(
            rate, key, None, algorithm, burst, buckets, cost, tuple(methods), charge_when,
            override_defaults, message,
        )  # fmt: skip
        return self.decorator(self.table.mark(limit))

    def shared_limit(
        self, rate: RateSpec | RateFunc, name: str, **options: Any
    ) -> Callable[[F], F]:
        """A limit named ``name``: one counter for every view it decorates (the options of
        ``limit``)."""
        return self.decorator(self.table.mark(Limit(rate, name=name, **options)))

    def nested_limit(
        self, levels: Iterable[CheckLevel], *, name: str | None = None, **options: Any
    ) -> Callable[[F], F]:
        """Decorate a view (or a group of views) with nested limits: ``levels`` (outermost
        first), each with its own key and rate, charged all or nothing; with ``actual=`` the
        ``cost`` is an estimate settled when the response has ended. Options: those of
        ``NestedLimit``; counted per route unless given a ``name``."""
        limit: NestedLimit = nested_limit(list(levels), name=name, **options)
        return self.decorator(self.table.mark(limit))

    def decorator(self, mark: Callable[[F], F]) -> Callable[[F], F]:
        """What ``limit`` and ``shared_limit`` return, given the decorator that marks a view:
        that decorator itself, unless a framework needs more."""
        return mark

    def exempt(self, target: F) -> F:
        """Free a view (or a group of views) from the default limits."""
        return self.table.exempt(target)


def _named(limits: tuple[Limit, ...], name: str) -> tuple[Limit, ...]:
    """Application limits: each one counter for the whole app, so each needs a name."""
    return tuple(
        limit
        if limit.name is not None
        else dataclasses.replace(limit, name=name if i == 0 else f"{name}#{i + 1}")
        for i, limit in enumerate(limits)
    )
