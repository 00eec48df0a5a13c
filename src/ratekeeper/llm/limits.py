"""A gateway's limits: who a caller is, what each level counts, and the nested call they make.

``Caller(key, org, team)`` is who the gateway knows the client to be — from its API key, never
from what the request says of itself. Each ``Limit`` counts ``tokens`` (the reservation's
estimate, settled with the provider's usage) or ``requests`` (1 a call, never settled) for the
caller's ``org``, ``team`` or ``key``; all of them are one nested call (``ratekeeper.nested``):
every level decided before any is charged, a rejection charges none, in one store round trip.

Levels go outermost first: the org's limits, then the team's (left out for a caller without
a team), then the key's. The first is the outer key's own counter (the org's; the team's or the
key's when no org limit is set); every level below is named by its limit's ``name``, so no
client string reaches another level's counter (docs/nested.md).

A limit's rate is a rate (``"100000/minute"``, a stack, a ``Rate``) or a function of the
caller returning one (an org's own monthly budget on its billing day:
``Rate.per_calendar(n, "month", anchor="15")``), or None for no such limit for this caller.
A limit whose rates are a day or longer is a **budget**: its 429 says ``insufficient_quota``
and tells the SDKs not to retry. ``debt`` bounds how far a settled overrun takes a token
level past its limit (default: a tenth of its smallest rate's count); requests never owe.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from ..decision import Decision
from ..errors import ConfigError
from ..nested import MAX_LEVELS, Level, NestedDecision, compile_levels
from ..plan import make_policy
from ..rates import Rate, to_rates
from .headers import Figures

RateSpec = str | Rate | Sequence[Rate]
SCOPES = ("org", "team", "key")
COUNTS = ("tokens", "requests")
DAY = 86_400.0


@dataclass(frozen=True, slots=True)
class Caller:
    """Who a request is from: its API key, its org, its team (None: no team level)."""

    key: str
    org: str
    team: str | None = None


@dataclass(frozen=True, slots=True)
class Limit:
    """One level: ``counts`` (tokens or requests) per ``scope`` (org, team or key) at ``rate``
    (module docstring); ``name`` (default ``<scope>-<counts>``) names it in headers and
    counters, ``algorithm``, ``debt`` and ``aligned`` (fixed windows on the clock's
    multiples of the period: every key's minute starts on the minute) as for a ``Level``."""

    scope: str
    rate: RateSpec | Callable[[Caller], RateSpec | None]
    counts: str = "tokens"
    algorithm: str = "fixed_window"
    debt: int | None = None
    name: str | None = None
    aligned: bool = False

    @property
    def label(self) -> str:
        """The level's name."""
        return self.name or f"{self.scope}-{self.counts}"


@dataclass(frozen=True, slots=True)
class Rejection:
    """Why a reservation was refused: the limit, its caller key and decision, the estimate."""

    limit: Limit
    key: str
    decision: Decision
    requested: int

    @property
    def budget(self) -> bool:
        """Whether the refusing limit is a budget (a day or longer)."""
        return self.decision.stack[0].period >= DAY or any(
            r.calendar is not None for r in self.decision.stack
        )


class Limits:
    """A gateway's limits, checked once (``ConfigError`` names the first problem)."""

    def __init__(self, limits: Sequence[Limit]) -> None:
        if isinstance(limits, Limit) or not limits:
            raise ConfigError(f"limits {limits!r} are invalid; expected a list of Limit")
        if len(limits) > MAX_LEVELS:
            raise ConfigError(f"{len(limits)} limits are too many; expected at most {MAX_LEVELS}")
        seen: set[str] = set()
        for limit in limits:
            if not isinstance(limit, Limit):
                raise ConfigError(f"limit {limit!r} is invalid; expected a Limit")
            if limit.scope not in SCOPES:
                raise ConfigError(f"Limit scope {limit.scope!r} is unknown; expected one of "
                                  f"{', '.join(SCOPES)}")  # fmt: skip
            if limit.counts not in COUNTS:
                raise ConfigError(f"Limit counts {limit.counts!r} is unknown; expected "
                                  "'tokens' or 'requests'")  # fmt: skip
            if limit.label in seen:
                raise ConfigError(f"two limits are named {limit.label!r}; give each a name")
            seen.add(limit.label)
            if not callable(limit.rate):
                self.level(limit, limit.rate, "check", check=True)  # a bad rate: refused now
            elif limit.algorithm != "fixed_window" or limit.debt is not None or limit.aligned:
                self.level(limit, "1/second", "check", check=True)  # a bad algorithm or debt
        order = {scope: i for i, scope in enumerate(SCOPES)}
        self.limits = tuple(sorted(limits, key=lambda x: order[x.scope]))

    def levels(self, caller: Caller) -> tuple[list[Level], list[Limit]]:
        """The caller's levels, outermost first, and the limit of each. A rate function that
        raises, or answers no rate, raises ``ConfigError`` (the gateway answers 500)."""
        levels: list[Level] = []
        used: list[Limit] = []
        for limit in self.limits:
            key = {"org": caller.org, "team": caller.team, "key": caller.key}[limit.scope]
            if key is None:
                continue
            spec = limit.rate
            rate: RateSpec | None
            if callable(spec):
                try:
                    rate = spec(caller)
                except Exception as exc:
                    raise ConfigError(f"the rate function of limit {limit.label!r} raised "
                                      f"{exc!r}") from exc  # fmt: skip
                if rate is None:
                    continue
            else:
                rate = spec
            levels.append(self.level(limit, rate, key))
            used.append(limit)
        return levels, used

    @staticmethod
    def level(limit: Limit, rate: object, key: str, check: bool = False) -> Level:
        """The ``Level`` of ``limit`` for ``key`` at ``rate``; with ``check``, validated as the
        limiter will (``ConfigError``), else the limiter refuses it when called."""
        try:
            rates = to_rates(rate)  # type: ignore[arg-type]  # checked by to_rates
        except (TypeError, ValueError) as exc:
            raise ConfigError(f"limit {limit.label!r}: rate {rate!r} is invalid: {exc}") from exc
        if limit.counts == "requests":
            level = Level(key, rates, limit.algorithm, aligned=limit.aligned, cost=1, debt=0,
                          name=limit.label)  # fmt: skip
        else:
            debt = limit.debt
            if debt is None:
                debt = max(1, min(r.count for r in rates) // 10)
            level = Level(key, rates, limit.algorithm, aligned=limit.aligned, debt=debt,
                          name=limit.label)  # fmt: skip
        if check:
            try:
                compile_levels([level], 1, make_policy)
            except ConfigError as exc:
                raise ConfigError(f"limit {limit.label!r}: {exc}") from exc
        return level


def tightest(decision: NestedDecision, used: Sequence[Limit], counts: str) -> Figures | None:
    """The figures of the level counting ``counts`` with the least left, if any."""
    best: Decision | None = None
    for limit, d in zip(used, decision.levels, strict=True):
        if limit.counts == counts and (best is None or d.remaining < best.remaining):
            best = d
    if best is None:
        return None
    return Figures(best.limit, best.remaining, max(0.0, best.reset_at - best.now), best.reset_at)


def rejection(decision: NestedDecision, levels: Sequence[Level], used: Sequence[Limit],
              estimate: int) -> Rejection:  # fmt: skip
    """Why ``decision`` refused: the refusing level's limit and figures."""
    i = decision.level
    limit = used[i]
    return Rejection(limit, levels[i].key, decision.levels[i],
                     1 if limit.counts == "requests" else estimate)  # fmt: skip
