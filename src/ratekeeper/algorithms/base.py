"""What every algorithm module provides, and the small value types its pure step uses.

An algorithm module is a plain module with ``NAME``, ``CODE`` (one letter used in store keys),
``OPTIONS`` and four pure functions — no I/O, no clock, no locks:

- ``make_limit(rate, options) -> Limit``: validate the options for one rate of a stack;
- ``step(state, limit, now_ms, cost, charge) -> (Outcome, new_state)``: decide one rate;
  ``charge=False`` is a peek (the outcome says whether ``cost`` would fit, remaining is as now);
- ``refund(state, limit, now_ms, cost) -> new_state``: give back, never past empty/full;
- ``credit`` and ``debit`` (same arguments): an admin's top-up and charge. ``debit`` charges
  ``cost`` whether or not it fits (a refilling or sliding state at most ``DEBT`` capacities
  past empty); ``credit`` is ``refund``, except that fixed_window's count may go below zero
  (the window then holds more than its limit);
- ``expires_ms(state, limit) -> int``: when the state stops mattering (sweeps and Redis TTLs).
  After a charged, admitted step it equals the outcome's ``reset_ms`` (a fully reset rate is
  the same as no state), which the memory store's one-rate hit uses instead of calling it;
- ``settle(state, limit, now_ms, delta, since_ms, charged_ms, debt) -> new_state``: a
  reservation made at ``since_ms``, whose charge answered ``reset_ms`` ``charged_ms``, turned
  out to cost ``delta`` more units (or ``-delta`` fewer) than it took: a refund where the
  reservation was counted (found by whichever of the two marks the algorithm needs: a log's
  entries carry ``since_ms``, a window or bucket is named by its ``reset_ms``, which another
  caller's clock cannot move), or a charge now that may run past the limit by up to ``debt``
  units (``reservations``); ``state`` itself when nothing changes;
- ``check_debt(limit, debt)``: refuse a debt whose arithmetic would leave the exact range.

A rejected step changes nothing, unless its ``Limit.flags`` has ``COUNT_REJECTED`` (an option
only fixed_window takes): then a rejected hit is charged too, and stores write the state the
step returns whether or not it admits (the same ``expires_ms``/``reset_ms`` rule holds).

Times are integer epoch milliseconds (``now_ms``); the Lua twin in ``lua/<name>.lua`` does the
same integer arithmetic (all values stay below 2**53, where doubles are exact), so the memory
store and Redis reach identical decisions.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from functools import partial
from typing import Any, NamedTuple, Protocol

from ..errors import ConfigError
from ..rates import Rate

EXACT = 2**53
"""Integers below this are exact in a double, the only number type in Redis' Lua."""

INF = float("inf")

COUNT_REJECTED = 2
"""``Limit.flags`` bit: every hit is charged, admitted or not (envoyproxy/ratelimit's counting)."""

DEBT = 2
"""How many capacities past empty a ``debit`` may take a refilling or sliding state: the most
an admin's charge can set a key back (a fixed window counts any debit, up to its cap)."""

HORIZON_MS = 4_102_444_800_000
"""2100-01-01 in epoch ms: exactness checks that add a duration to ``now`` assume now before it."""


@dataclass(frozen=True, slots=True)
class Limit:
    """One rate of a stack with its algorithm's options resolved: all a step needs.

    ``capacity`` is the most units that may pass at one instant: ``burst`` when set, else
    ``count``. It is derived once here because every step reads it. ``unit`` is a constant an
    algorithm derives from the rate once instead of on every step (gcra: the emission interval
    in µs); 0 when unused. ``flags`` holds yes/no options as bits (fixed_window: ``ALIGNED``,
    ``COUNT_REJECTED``); it is sent to the Lua twin as the rate's ``extra`` argument.
    """

    rate: Rate
    count: int
    period_ms: int
    burst: int = 0
    buckets: int = 1
    unit: int = 0
    flags: int = 0
    capacity: int = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "capacity", self.burst or self.count)


class Outcome(NamedTuple):
    """One rate's answer. Times in epoch ms; ``retry_ms`` is 0 when allowed, inf if never
    (the steps give whole ms as an ``int``, the Redis reply a ``float``: they compare equal)."""

    allowed: bool
    remaining: int
    reset_ms: int
    retry_ms: float


new_outcome: Callable[[tuple[bool, int, int, float]], Outcome] = partial(tuple.__new__, Outcome)
"""``Outcome(*fields)`` for the steps' hot path: skips the named tuple's Python ``__new__``."""


class Algorithm(Protocol):
    """The shape of an algorithm module (modules satisfy this protocol structurally)."""

    NAME: str
    CODE: str
    OPTIONS: frozenset[str]

    def make_limit(self, rate: Rate, options: dict[str, int]) -> Limit: ...

    def step(
        self, state: Any, limit: Limit, now_ms: int, cost: int, charge: bool
    ) -> tuple[Outcome, Any]: ...

    def refund(self, state: Any, limit: Limit, now_ms: int, cost: int) -> Any: ...

    def credit(self, state: Any, limit: Limit, now_ms: int, cost: int) -> Any: ...

    def debit(self, state: Any, limit: Limit, now_ms: int, cost: int) -> Any: ...

    def expires_ms(self, state: Any, limit: Limit) -> int: ...

    def settle(
        self,
        state: Any,
        limit: Limit,
        now_ms: int,
        delta: int,
        since_ms: int,
        charged_ms: int,
        debt: int,
    ) -> Any: ...

    def check_debt(self, limit: Limit, debt: int) -> None: ...


def int_option(name: str, value: object, low: int, high: int, algorithm: str) -> int:
    """Validate a whole-number option, naming it and its range when it is wrong."""
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        raise ConfigError(
            f"option {name}={value!r} for {algorithm} is invalid; expected a whole number "
            f"from {low} to {high:_}"
        )
    return value


def check_exact(value: int, what: str, algorithm: str) -> None:
    """Refuse a configuration whose arithmetic would leave the exact range of a double."""
    if value >= EXACT:
        raise ConfigError(f"{what} is too large for {algorithm} (must stay below 2**53)")


def ceil_div(a: int, b: int) -> int:
    """Integer ceiling of a / b for b > 0."""
    return -(-a // b)
