"""Nested limits: one all-or-nothing decision over several caller keys (org > user > key).

A nested call names its levels outermost first, each a caller key under its own rate (or
stack) and algorithm::

    limiter.nested([Level("org:acme", "10000/hour"), Level("user:42", "1000/hour"),
                    Level("key:k1", "100/minute", algorithm="token_bucket")])

Rules, the same on every store (the memory store runs them in Python, the Redis stores in one
``nested.lua`` call):

- **Every level is decided before any is charged**: each level is looked at (a peek of its
  cost) and only if all admit is each charged. A rejection at any level charges no level.
- **One store call**, hash-tagged on the outermost key: its shard (``ShardedRedisStore``), its
  Cluster slot, its ``RolloutStore`` side. So an inner level's counter belongs to the
  outermost key: level 0 is the outer key's own counter (the one ``hit`` uses), a level
  below it is the counter of (outer key, the level, its key) — ``user:42`` under ``org:acme``
  and under ``org:beta`` are two counters, on every store. A key shared across outer keys
  gets a call of its own (docs/nested.md).
- **A counter is named by its level, never by a key alone**: the level is its ``name`` (and,
  for a name several levels of the call share or levels without one, which of them it is:
  ``Tier.label``), so the same string at two levels is two counters. Keys come from clients
  (headers, tokens); whatever they are, they select a key within their level, never another
  level's counter, and no two levels of a call ever collapse into one.
- **The decision** (``NestedDecision``) holds every level's ``Decision``; ``level`` names the
  one that decided: when rejected, the rejecting level that frees up last (its
  ``retry_after`` is when the whole call could pass); when admitted, the tightest level —
  the fewest further requests of this cost — whose headers the response carries.
- A level's ``cost`` is its own (a request counter beside a token budget) or, left None, the
  call's cost (a reservation's estimate, settled later: ``reservations``).

Timeline, ``org`` 3/minute and ``user`` 2/minute, cost 1::

    t=0  [org, user:1]  admitted   org 1/3 used, user:1 1/2
    t=1  [org, user:1]  admitted   org 2/3, user:1 2/2
    t=2  [org, user:1]  rejected by level 1 (user:1), retry_after 58 s; org stays at 2/3
    t=3  [org, user:2]  admitted   org 3/3, user:2 1/2
    t=4  [org, user:3]  rejected by level 0 (org), retry_after 56 s; user:3 charged nothing

What belongs here is pure: ``Level`` (what a caller gives), ``Tier`` (a level validated once,
with its policy and resolved cost), ``NestedPlan`` (one call as plain data for a store),
``run_levels`` (the rule over loaded states, for the memory store) and ``decide_nested``.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from ..algorithms import Outcome
from ..decision import Decision
from ..errors import ConfigError
from ..plan import Policy, check_key, decide, degraded, make_plan
from ..rates import Rate

RateSpec = str | Rate | Sequence[Rate]
NestedOp = Literal["hit", "peek", "refund", "reserve", "settle", "cancel"]
MAX_LEVELS = 16
"""More levels than any hierarchy needs; a call's size (and its script's time) stays bounded."""
MAX_DEBT = 10**12
MAX_COST = 10**12
"""The largest cost (a call's, a level's own, an estimate or an actual cost) a call takes."""

NestedReply = tuple[int, tuple[tuple[Outcome, ...], ...]]
"""A store's answer: for hit/peek/reserve, allowed (1/0) and each level's outcomes; for
settle/cancel, a status (``reservations.STATUSES``) and no outcomes; for refund, (1, ())."""


@dataclass(frozen=True, slots=True)
class Level:
    """One level of a nested call: a caller key under a rate (or stack) and an algorithm.

    ``cost`` None (the default) takes the call's cost — a reservation's estimate, settled
    with the actual cost; a number is this level's own cost, never settled (a request
    counter beside a token budget). ``debt`` bounds how far a settled extra may take the
    level past its limit, in its units (None: each rate's capacity; 0: never past it).
    ``name`` names the level in headers (default: its rates, as for ``hit``).
    """

    key: str
    rate: RateSpec
    algorithm: str = "fixed_window"
    burst: int | None = None
    buckets: int | None = None
    aligned: bool = False
    cost: int | None = None
    debt: int | None = None
    name: str | None = None


@dataclass(frozen=True, slots=True)
class Tier:
    """A validated level: its policy, the cost it is charged, whether a settle applies to it,
    the debt each rate may carry, the outer key its counter is scoped under (None for level 0,
    the outer key's own counter) and, below level 0, ``label``: which level it is, as its
    counters' names carry it (``level_label``)."""

    key: str
    policy: Policy
    cost: int
    settles: bool
    debts: tuple[int, ...]
    name: str | None
    scope: str | None
    label: str = ""


@dataclass(frozen=True, slots=True)
class NestedPlan:
    """One nested operation as plain data: all a store needs.

    ``key`` is the outermost key (placement, breaker partition). ``rid`` names a reservation;
    ``amount`` is a reserve's time to live (ms) or a settle's actual cost; ``keep_ms`` is how
    long a settled reservation's id is remembered; ``hold_ms`` the least time the store keeps
    the reservations of this outer key (past any state they may have to give back to).
    """

    op: NestedOp
    key: str
    levels: tuple[Tier, ...]
    now_ms: int
    rid: str = ""
    amount: int = 0
    keep_ms: int = 0
    hold_ms: int = 0


PolicyOf = Callable[[RateSpec, str, "int | None", "int | None", bool], Policy]
"""The limiter's cached ``make_policy`` (rates, algorithm, burst, buckets, aligned)."""


def compile_levels(levels: object, cost: int, policy_of: PolicyOf) -> tuple[Tier, ...]:
    """Validate a caller's levels once; raise ``ConfigError`` naming the first problem."""
    if isinstance(levels, Level | str) or not isinstance(levels, Sequence):
        raise ConfigError(
            f"levels {levels!r} are invalid; expected a list of Level(key, rate, ...), "
            "outermost first"
        )
    if not 1 <= len(levels) <= MAX_LEVELS:
        raise ConfigError(
            f"a nested call has {len(levels)} levels; expected 1 to {MAX_LEVELS}, outermost first"
        )
    if type(cost) is not int or not 0 <= cost <= MAX_COST:
        check_amount(cost, "cost")
    tiers: list[Tier] = []
    named: dict[str, int] = {}  # inner levels so far by name ('' for none)
    outer = ""
    for index, level in enumerate(levels):
        if not isinstance(level, Level):
            raise ConfigError(f"level {index} is {level!r}; expected Level(key, rate, ...)")
        key = check_key(level.key)
        if index == 0:
            outer = key
        if isinstance(level.rate, str) and level.rate.strip().startswith("plan:"):
            raise ConfigError(
                f"level {index} ({key!r}) rate {level.rate!r} names a plan's limit; a nested "
                "level takes its rates itself (e.g. '1000/hour'): plans do not nest"
            )
        policy = policy_of(level.rate, level.algorithm, level.burst, level.buckets, level.aligned)
        own = level.cost
        if own is not None:
            check_amount(own, f"level {index} ({key!r}) cost", " (or None for the call's cost)")
        if level.name is not None and (
            not isinstance(level.name, str) or not level.name or "\n" in level.name
        ):
            raise ConfigError(f"level {index} name={level.name!r} is invalid; expected a string")
        label = ""
        if index:  # level 0 is the outer key's own counter; the others are scoped under it
            name = level.name or ""
            repeat = named.get(name, 0)
            named[name] = repeat + 1
            plain = not repeat and "%" not in name and "#" not in name  # its label: itself
            label = name if plain else level_label(name, repeat)
        tiers.append(
            Tier(
                key,
                policy,
                cost if own is None else own,
                own is None,
                _debts(policy, level.debt, index, key),
                level.name,
                None if index == 0 else outer,
                label,
            )
        )
    return tuple(tiers)


def check_amount(value: object, what: str, more: str = "") -> int:
    """A cost, estimate or actual cost: a whole number from 0 to ``MAX_COST``."""
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= MAX_COST:
        raise ConfigError(
            f"{what}={value!r} is invalid; expected a whole number from 0 to {MAX_COST:_}{more}"
        )
    return value


def level_label(name: str, repeat: int) -> str:
    """An inner level as its counters' names carry it: its name ('' for none), then ``#n``
    for the n-th later level of the call with that name. Written injectively (``%`` and ``#``
    of a name escaped), so no two levels of a call share a label, whatever their names."""
    text = name.replace("%", "%25").replace("#", "%23")
    return f"{text}#{repeat}" if repeat else text


def _debts(policy: Policy, debt: object, index: int, key: str) -> tuple[int, ...]:
    if debt is not None and (
        isinstance(debt, bool) or not isinstance(debt, int) or not 0 <= debt <= MAX_DEBT
    ):
        raise ConfigError(
            f"level {index} ({key!r}) debt={debt!r} is invalid; expected a whole number from "
            f"0 to {MAX_DEBT:_} (units past the limit a settle may charge), or None for each "
            "rate's capacity"
        )
    out = []
    for limit in policy.limits:
        units = limit.capacity if debt is None else debt
        policy.algorithm.check_debt(limit, units)
        out.append(units)
    return tuple(out)


def counter(tier: Tier, slot: str) -> tuple[str, str]:
    """A tier's state slot as an in-process store names it: level 0 as ``hit`` does
    (``(slot, key)``); a scoped level under ``>`` + slot, which no plain slot starts with, and
    (outer, label, key) written injectively."""
    if tier.scope is None:
        return (slot, tier.key)
    scope, label = tier.scope, tier.label
    return (">" + slot, f"{len(scope)}:{scope}{len(label)}:{label}{tier.key}")


def run_levels(
    plan: NestedPlan, states: Sequence[Sequence[Any]], charge: bool
) -> tuple[bool, list[list[Outcome]], list[list[Any]]]:
    """The nested rule over loaded states (one list per tier, one state per rate): look at
    every level; if all admit and ``charge``, step each again charging. Returns whether all
    admit, the outcomes (of the charge when made, else of the look) and the new states (the
    loaded ones when nothing is charged; a level of cost 0 is looked at, never written)."""
    now = plan.now_ms
    looks: list[list[Outcome]] = []
    allowed = True
    for tier, tier_states in zip(plan.levels, states, strict=True):
        step = tier.policy.algorithm.step
        out = [
            step(s, limit, now, tier.cost, False)[0]
            for s, limit in zip(tier_states, tier.policy.limits, strict=True)
        ]
        allowed = allowed and all(o.allowed for o in out)
        looks.append(out)
    if not (allowed and charge):
        return allowed, looks, [list(s) for s in states]
    outcomes: list[list[Outcome]] = []
    new_states: list[list[Any]] = []
    for tier, tier_states, look in zip(plan.levels, states, looks, strict=True):
        if tier.cost == 0:  # nothing to charge: a look opens no window
            outcomes.append(look)
            new_states.append(list(tier_states))
            continue
        step = tier.policy.algorithm.step
        pairs = [
            step(s, limit, now, tier.cost, True)
            for s, limit in zip(tier_states, tier.policy.limits, strict=True)
        ]
        outcomes.append([o for o, _ in pairs])
        new_states.append([n for _, n in pairs])
    return True, outcomes, new_states


@dataclass(frozen=True, slots=True)
class NestedDecision:
    """The answer to a nested call: ``allowed`` if every level admitted (and so was charged).

    ``levels`` holds each level's ``Decision`` (outermost first); ``level`` is the index of
    the one that decided — the rejecting level that frees up last, else the tightest level
    (fewest further requests of this cost) — and ``decision`` is its ``Decision``, whose
    headers ``headers()`` renders under the level's name. ``degraded`` marks a fail-open
    answer given without the store.
    """

    allowed: bool
    level: int
    levels: tuple[Decision, ...]
    names: tuple[str | None, ...]
    degraded: bool = False

    @property
    def decision(self) -> Decision:
        """The deciding level's ``Decision``."""
        return self.levels[self.level]

    @property
    def rejected_by(self) -> int | None:
        """The index of the level that rejected (the one that frees up last), else None."""
        return None if self.allowed else self.level

    @property
    def retry_after(self) -> float:
        """Seconds until the same call would be admitted (0 when allowed, inf if never)."""
        return self.decision.retry_after

    @property
    def remaining(self) -> int:
        """What the deciding level has left (its ``Decision.remaining``)."""
        return self.decision.remaining

    @property
    def reset_at(self) -> float:
        """When the deciding level is fully reset or refilled (epoch seconds)."""
        return self.decision.reset_at

    def headers(self, policy: str | None = None, unit: str | None = None) -> dict[str, str]:
        """The deciding level's headers, named by the level's ``name`` (else ``policy``), in
        quota ``unit`` when not requests (``Decision.headers``)."""
        return self.decision.headers(self.names[self.level] or policy, unit)


def decide_nested(
    plan: NestedPlan, allowed: bool, outcomes: Sequence[Sequence[Outcome]], degraded: bool = False
) -> NestedDecision:
    """Fold each level's outcomes into its ``Decision`` and pick the deciding level."""
    now = plan.now_ms
    decisions = tuple(
        decide(make_plan("hit", tier.policy, tier.key, now, tier.cost), out)
        for tier, out in zip(plan.levels, outcomes, strict=True)
    )
    if not allowed:
        rejecting = [i for i, d in enumerate(decisions) if not d.allowed]
        level = max(rejecting, key=lambda i: decisions[i].retry_after) if rejecting else 0
    else:
        level = min(
            range(len(decisions)),
            key=lambda i: decisions[i].remaining // max(plan.levels[i].cost, 1),
        )
    names = tuple(tier.name for tier in plan.levels)
    return NestedDecision(allowed, level, decisions, names, degraded)


def degraded_nested(plan: NestedPlan) -> NestedDecision:
    """The fail-open answer when the store could not be asked: allowed, marked degraded."""
    decisions = tuple(
        degraded(make_plan("hit", tier.policy, tier.key, plan.now_ms, tier.cost))
        for tier in plan.levels
    )
    names = tuple(tier.name for tier in plan.levels)
    return NestedDecision(True, 0, decisions, names, degraded=True)
