"""Nested limits (org > user > key) and costs settled after the response, on routes.

A ``NestedLimit`` is to a ``middleware.NestedCheck`` what ``routes.Limit`` is to a
``RateCheck``: a rule not yet bound to a route, put on views with ``limits.nested_limit(...)``
(FastAPI, Flask) or ``nested_ratelimit(...)`` (Django). It obeys the route rules of
``routes``: without a ``name`` it counts per route (each route its own org, user and key
counters), with one it is one check wherever it is used; it overrides the default limits
unless ``override_defaults=False``.

Each level names its own key function and rate (``CheckLevel``), so the integration's default
key and algorithm do not apply to it. With ``actual`` the route's cost is reserved before the
view runs and settled when the response has ended (``middleware.costs``).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from ..middleware.checks import ChargeWhen, CheckLevel, CostFunc, NestedCheck
from ..middleware.costs import Actual
from ..middleware.request import KeyFunc


@dataclass(frozen=True, slots=True)
class NestedLimit:
    """A nested rule for routes; see ``NestedCheck`` for the fields."""

    levels: tuple[CheckLevel, ...]
    cost: int | CostFunc = 1
    actual: Actual | None = None
    ttl: float = 300.0
    unit: str = "requests"
    name: str | None = None
    methods: tuple[str, ...] = ()
    charge_when: ChargeWhen | None = None
    override_defaults: bool = True

    def __post_init__(self) -> None:
        if isinstance(self.methods, str):
            object.__setattr__(self, "methods", (self.methods,))
        object.__setattr__(self, "methods", tuple(m.upper() for m in self.methods))
        levels = self.levels
        if isinstance(levels, list):
            object.__setattr__(self, "levels", tuple(levels))
        self.bind(self.name or "limit")  # bad input fails here, at decoration

    @property
    def settles(self) -> bool:
        """Whether the cost is settled after the response (``actual`` given)."""
        return self.actual is not None

    def bind(self, name: str, key: KeyFunc | None = None, algorithm: str = "") -> NestedCheck:
        """The check this limit is on a route named ``name`` (its own name if it has one);
        ``key`` and ``algorithm`` (a rate limit's defaults) do not apply: each level has its
        own."""
        return NestedCheck(
            self.name or name,
            self.levels,
            cost=self.cost,
            actual=self.actual,
            ttl=self.ttl,
            unit=self.unit,
            methods=self.methods,
            charge_when=self.charge_when,
        )


def nested_limit(
    levels: Sequence[CheckLevel],
    *,
    cost: int | CostFunc = 1,
    actual: Actual | None = None,
    ttl: float = 300.0,
    unit: str = "requests",
    name: str | None = None,
    methods: Sequence[str] = (),
    charge_when: ChargeWhen | None = None,
    override_defaults: bool = True,
) -> NestedLimit:
    """A ``NestedLimit`` from keyword arguments (the decorators' signature)."""
    return NestedLimit(
        tuple(levels), cost, actual, ttl, unit, name, tuple(methods), charge_when,
        override_defaults,
    )  # fmt: skip
