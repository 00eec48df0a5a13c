"""Reservations: admit on an estimate now, settle with the actual cost once it is known.

An LLM response's tokens are known when it ends; a reservation takes an estimate at the
start and is settled with the truth at the end::

    r = limiter.reserve([Level("org:acme", "1000000/minute"), Level("key:k1", "100000/minute")],
                        estimate=2000)
    if r.allowed:
        ...                                  # stream the completion
        limiter.settle(r, actual=tokens)     # or limiter.cancel(r) if it never ran

- **reserve** is a nested call (``nested``) charging ``estimate`` on every level whose
  ``cost`` is None (a level with a cost of its own, a request counter, keeps it), all or
  nothing, and recording the reservation beside the counters in the same store call.
- **settle** charges the difference on those levels: ``actual < estimate`` gives the rest back
  where the reservation was counted; ``actual > estimate`` charges the extra now, past the
  limit if need be, into a debt the next requests pay back (they are rejected until it is
  paid), as LLM providers do. A level's debt is bounded: it never goes more than ``debt``
  units past its limit (``Level.debt``; default each rate's capacity, so usage stays within
  twice the limit), the rest of an extra is forgiven.
- **cancel** gives the whole estimate back.
- **Expiry, kept by the store**: a reservation lives ``ttl`` seconds of the limiter's clock.
  Past that, the store gives its estimate back at the next reservation or nested call on the
  same outermost key (each such call first sweeps up to 32 expired reservations there;
  ``MemoryStore.sweep`` all): a process that crashed mid-request leaks nothing. A settle after
  expiry charges the actual cost now, as an extra (the estimate already came back), so the
  total charged is the actual cost either way.
- **Once**: a reservation settles or cancels once; the store remembers it for ``ttl`` more, and
  a second settle or cancel in that time charges nothing (``already_settled``). A reservation
  the limiter never saw (an id it did not issue) settles as an expired one.

Per algorithm (each module's ``settle``; docs/reservations.md has the table):

- fixed_window: a refund goes back into the window the reservation was counted in while it is
  the live one (a window that ended gave everything back when the next opened); an extra
  goes into the live window (opened if none), the count up to limit + debt.
- token_bucket: tokens back now (never above burst); an extra takes tokens down to -debt,
  which the refill pays back.
- gcra: the arrival time moves back (never before now), or on up to now + (burst + debt) T.
- sliding_window: a refund comes out of the bucket the reservation was counted in while it
  is in the estimate; an extra goes into the newest bucket, the estimate up to limit + debt.
- sliding_log: the reservation's entries are removed while in the window; an extra appends
  entries now, up to limit + debt in the window.

``Reservation`` is the caller's handle (plain data: the service sends its fields as a token);
``Settlement`` the answer to a settle or cancel. What belongs here is pure: values, checks and
plans. The stores run the plans (``stores/nested_memory.py``, ``algorithms/lua/nested.lua``).
"""

from __future__ import annotations

import math
import secrets
from dataclasses import dataclass
from typing import Literal

from ..errors import ConfigError
from .levels import MAX_COST, NestedDecision, NestedPlan, Tier
from .levels import check_amount as check_amount

MAX_TTL = 86_400.0
"""A day: a reservation lives from 1 ms to this long."""
MAX_AMOUNT = MAX_COST
"""The largest estimate or actual cost: 10**12, as for any cost."""
SettleStatus = Literal["settled", "already_settled", "expired", "degraded"]
STATUSES: dict[int, SettleStatus] = {1: "settled", 2: "already_settled", 3: "expired"}
"""A store's settle/cancel status codes: 1 settled now, 2 settled or cancelled before (nothing
charged), 3 not found — expired (its estimate given back) or never issued."""


@dataclass(frozen=True, slots=True)
class Reservation:
    """An admitted (or refused) estimate, to settle or cancel once.

    ``id`` names it in the store; ``key`` is the outermost level's key; ``levels`` the validated
    levels it was made on; ``reserved_at`` the limiter's time of the reserve (epoch seconds),
    ``ttl`` how long it lives. ``decision`` is the nested decision of the reserve.
    """

    id: str
    key: str
    levels: tuple[Tier, ...]
    estimate: int
    ttl: float
    reserved_at: float
    decision: NestedDecision

    @property
    def allowed(self) -> bool:
        """Whether the estimate was admitted (only then is there anything to settle)."""
        return self.decision.allowed

    @property
    def degraded(self) -> bool:
        """Admitted without the store (failing open): nothing was recorded; a settle charges
        the actual cost, as for an expired reservation."""
        return self.decision.degraded

    @property
    def expires_at(self) -> float:
        """When the store gives the estimate back if it is not settled (epoch seconds)."""
        return self.reserved_at + self.ttl


@dataclass(frozen=True, slots=True)
class Settlement:
    """The answer to a settle or cancel: ``status`` is ``settled`` (the difference charged or
    given back now), ``already_settled`` (nothing charged), ``expired`` (the estimate had come
    back; a settle charged ``actual`` now, a cancel nothing) or ``degraded`` (the store could
    not be asked; nothing happened)."""

    status: SettleStatus
    actual: int

    @property
    def settled(self) -> bool:
        """True when this call settled the reservation (``settled`` or ``expired``)."""
        return self.status in ("settled", "expired")


def restored(rid: str, levels: tuple[Tier, ...], ttl: float) -> Reservation:
    """An admitted reservation known by its id, levels and ``ttl`` only (a token the service
    handed out): enough to settle or cancel it, which read no more."""
    decision = NestedDecision(True, 0, (), ())
    return Reservation(rid, levels[0].key, levels, 0, ttl, 0.0, decision)


def new_id() -> str:
    """A reservation id: 128 random bits, URL-safe (never guessed, never reused)."""
    return secrets.token_urlsafe(16)


def check_ttl(ttl: object) -> int:
    """A reservation's time to live in seconds -> whole ms (1 ms to a day)."""
    if (
        isinstance(ttl, bool)
        or not isinstance(ttl, int | float)
        or not math.isfinite(ttl)
        or not 0.001 <= ttl <= MAX_TTL
    ):
        raise ConfigError(
            f"ttl={ttl!r} is invalid; expected seconds from 0.001 to {MAX_TTL:.0f} (a day)"
        )
    return round(ttl * 1000)


def hold_ms(levels: tuple[Tier, ...], ttl_ms: int) -> int:
    """How long the store keeps an outer key's reservations at least: past the reservation's
    life by as long as the state it was charged to may matter (a window of each rate, or the
    time a bucket in debt takes to fill), so an expired estimate always finds where it goes."""
    longest = 0
    for tier in levels:
        for limit, debt in zip(tier.policy.limits, tier.debts, strict=True):
            refill = -(-(limit.capacity + debt) // limit.count) * limit.period_ms
            longest = max(longest, 2 * limit.period_ms + refill)
    return ttl_ms + longest


def reserve_plan(levels: tuple[Tier, ...], now_ms: int, rid: str, ttl_ms: int) -> NestedPlan:
    """The store call of a reserve."""
    return NestedPlan(
        "reserve", levels[0].key, levels, now_ms, rid, ttl_ms, ttl_ms, hold_ms(levels, ttl_ms)
    )


def settle_plan(
    reservation: Reservation, op: Literal["settle", "cancel"], actual: int, now_ms: int
) -> NestedPlan:
    """The store call of a settle (``actual`` charged) or cancel (``actual`` 0)."""
    if not isinstance(reservation, Reservation):
        raise ConfigError(f"{reservation!r} is not a Reservation; pass what reserve() returned")
    if not reservation.allowed:
        raise ConfigError(
            f"reservation {reservation.id!r} was not admitted (rejected by level "
            f"{reservation.decision.rejected_by}): there is nothing to {op}"
        )
    ttl_ms = round(reservation.ttl * 1000)
    return NestedPlan(
        op,
        reservation.key,
        reservation.levels,
        now_ms,
        reservation.id,
        actual,
        ttl_ms,
        hold_ms(reservation.levels, ttl_ms),
    )
