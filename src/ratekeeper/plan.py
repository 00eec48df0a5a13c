"""The sans-I/O core: calls become ``Plan`` data, store replies become ``Decision``s.

Nothing here does I/O, so ``Limiter`` and ``AsyncLimiter`` share it and differ only in how they
execute a plan, and the service can run many plans in one Redis pipeline.

- ``Policy``: rates + algorithm + options, validated once and cached by the limiter; ``slots``
  name each rate's state for store keys: the limit's name (when it has one), the algorithm's
  code, the state-shaping options and the window's length — never the rate's count, so a
  limit raised or lowered (a plan, an override) keeps what its keys have used
  (``f:1h``, ``api|f:1h``, ``s4:1m``, ``f4:30d`` for a calendar month).
- ``Plan``: one operation (``hit``/``peek``/``refund``/``reset``, or an admin's ``credit``/
  ``debit``) on one caller key at one time.
- ``run_stack``: the all-or-nothing stack rule over the pure algorithm steps (memory store).
- ``decide``: outcomes of every rate -> the one ``Decision`` the caller sees.
- ``administer``: an admin's reset, credit or debit of one key's states, with what a peek
  shows before and after (the memory store; the Redis stores run the same in one script).
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal

from .algorithms import ALGORITHMS, Algorithm, Limit, Outcome
from .algorithms.base import COUNT_REJECTED
from .decision import Decision, _DecisionFields, make_decision
from .errors import ConfigError, RateSpecError
from .rates import Rate, to_rates

Op = Literal["hit", "peek", "refund", "reset", "credit", "debit"]
AdminOp = Literal["reset", "credit", "debit"]
LIMIT_NAME = re.compile(r"^[A-Za-z0-9._:-]{1,200}$")


@dataclass(frozen=True, slots=True)
class Policy:
    """A validated stack of rates under one algorithm; ``name`` is the limit's (its counters'
    owner; empty for a rate given in a call), ``calendar`` whether a rate counts calendar
    periods (its window end is computed per call)."""

    algorithm: Algorithm
    limits: tuple[Limit, ...]
    slots: tuple[str, ...]
    rates: tuple[Rate, ...]
    name: str = ""
    calendar: bool = False
    legacy: tuple[str, ...] = ()
    """The slots' names in ratekeeper 0.1, which held the rate's count (``f:100/1m``), where
    they differ: a Redis store with ``legacy_keys`` reads state from them (an upgrade)."""


@dataclass(frozen=True, slots=True)
class Plan:
    """One operation on one caller key; all a store needs to act."""

    op: Op
    policy: Policy
    key: str
    now_ms: int
    cost: int


class _PlanFields:
    """``Plan``'s slots, writable: see ``decision._DecisionFields`` for why and how."""

    __slots__ = Plan.__slots__
    op: Op
    policy: Policy
    key: str
    now_ms: int
    cost: int


def make_plan(op: Op, policy: Policy, key: str, now_ms: int, cost: int) -> Plan:
    """``Plan(...)`` with the same arguments, built without the frozen ``__init__``."""
    p = _PlanFields()
    p.op = op
    p.policy = policy
    p.key = key
    p.now_ms = now_ms
    p.cost = cost
    p.__class__ = Plan  # type: ignore[assignment]  # same slots: see _PlanFields
    return p  # type: ignore[return-value]  # it is a Plan now; cast() would cost a call


def make_policy(
    rates: str | Rate | Sequence[Rate],
    algorithm: str,
    burst: int | None,
    buckets: int | None,
    aligned: bool = False,
    count_rejected: bool = False,
    name: str = "",
) -> Policy:
    """Validate rates, algorithm and options; raise a ``ValueError`` naming what is wrong.

    ``aligned`` and ``count_rejected`` are fixed_window's (False means not given). ``name``
    names the limit that owns the counters (1-200 letters, digits and ``. _ - :``)."""
    module = ALGORITHMS.get(algorithm) if isinstance(algorithm, str) else None
    if module is None:
        raise ConfigError(
            f"algorithm {algorithm!r} is unknown; expected one of {', '.join(sorted(ALGORITHMS))}"
        )
    options: dict[str, int] = {}
    given = (("burst", burst), ("buckets", buckets))
    for option, value in (*given, ("aligned", aligned), ("count_rejected", count_rejected)):
        if value is None or value is False:
            continue
        if option not in module.OPTIONS:
            takes = ", ".join(sorted(module.OPTIONS)) or "no options"
            raise ConfigError(f"option {option!r} does not apply to {algorithm}; it takes {takes}")
        options[option] = value
    stack = to_rates(rates)
    if name and (not isinstance(name, str) or not LIMIT_NAME.match(name)):
        raise ConfigError(
            f"limit name {name!r} is invalid; expected 1-200 letters, digits and . _ - :"
        )
    calendar = [r for r in stack if r.calendar is not None]
    if calendar and module.NAME != "fixed_window":
        raise ConfigError(
            f"rate {calendar[0]} counts calendar periods, which only fixed_window does; "
            f"{algorithm} needs windows of one length (e.g. {calendar[0].count}/"
            f"{calendar[0].window})"
        )
    if calendar and aligned:
        raise ConfigError(
            f"rate {calendar[0]} is aligned to its calendar already; drop aligned=True"
        )
    limits = tuple(module.make_limit(r, options) for r in stack)
    owner = f"{name}|" if name else ""
    slots = []
    for r, limit in zip(stack, limits, strict=True):
        if module.NAME == "sliding_window" and limit.buckets > 1:
            shape = f"{limit.buckets}"
        else:
            shape = f"{limit.flags}" if limit.flags else ""
        slots.append(f"{owner}{module.CODE}{shape}:{r.window}")
    if len(set(slots)) != len(slots):
        raise ConfigError(
            f"rates {', '.join(str(r) for r in stack)} repeat a period; a rate's counters are "
            "named by its period's length, so a stack gives each period once (two limits of "
            "one period: two named limits)"
        )
    legacy: tuple[str, ...] = ()
    if not name and not calendar:  # named limits and calendar rates are new: nothing to read
        old = tuple(
            f"{module.CODE}{limit.buckets}:{r.code}"
            if module.NAME == "sliding_window" and limit.buckets > 1
            else f"{module.CODE}{limit.flags or ''}:"
            + (r.window if limit.flags & COUNT_REJECTED else r.code)
            for r, limit in zip(stack, limits, strict=True)
        )
        legacy = () if old == tuple(slots) else old
    return Policy(module, limits, tuple(slots), stack, name, bool(calendar), legacy)


def check_cost(cost: object) -> int:
    """A cost is a whole number >= 0 (0 means peek)."""
    if isinstance(cost, bool) or not isinstance(cost, int) or cost < 0:
        raise RateSpecError(f"cost {cost!r} is invalid; expected a whole number >= 1 (0 to peek)")
    return cost


def check_key(key: object) -> str:
    """A caller key is any non-empty string."""
    if not isinstance(key, str) or not key:
        raise ConfigError(f"key {key!r} is invalid; expected a non-empty string")
    return key


def run_stack(
    policy: Policy,
    states: Sequence[Any],
    now_ms: int,
    cost: int,
    charge: bool,
    restated: list[tuple[int, Any]] | None = None,
) -> tuple[list[Outcome], list[Any] | None]:
    """Step every rate; return the outcomes and, if all admit (or the policy counts rejected
    hits too) and ``charge``, the new states. A hit that is not charged still restates a state
    written under another rate (gcra): with ``restated`` given, each such ``(index, state)``
    is added to it, for the store to write."""
    step = policy.algorithm.step
    outcomes: list[Outcome] = []
    new_states: list[Any] = []
    for state, limit in zip(states, policy.limits, strict=True):
        outcome, new_state = step(state, limit, now_ms, cost, charge)
        outcomes.append(outcome)
        new_states.append(new_state)
    if charge and (all(o.allowed for o in outcomes) or policy.limits[0].flags & COUNT_REJECTED):
        return outcomes, new_states
    if restated is not None:  # uncharged: an admitting rate's charged state is not kept
        for i, (state, limit) in enumerate(zip(states, policy.limits, strict=True)):
            if state is not None:
                _, same = step(state, limit, now_ms, cost, False)
                if same is not state:
                    restated.append((i, same))
    return outcomes, None


def decide(plan: Plan, outcomes: Sequence[Outcome]) -> Decision:
    """Fold per-rate outcomes into the caller's ``Decision`` (see its docstring for the rule)."""
    policy = plan.policy
    if len(outcomes) == 1:
        return decide_one(policy, outcomes[0], plan.now_ms)
    allowed = all(o.allowed for o in outcomes)
    if allowed:
        chosen = min(range(len(outcomes)), key=lambda i: outcomes[i].remaining)
    else:
        chosen = max(
            (i for i, o in enumerate(outcomes) if not o.allowed),
            key=lambda i: outcomes[i].retry_ms,
        )
    o = outcomes[chosen]
    return make_decision(
        o.allowed and allowed,
        policy.limits[chosen].capacity,
        o.remaining,
        o.reset_ms / 1000,
        0.0 if allowed else o.retry_ms / 1000,
        policy.rates[chosen],
        policy.rates,
        plan.now_ms / 1000,
        quotas=() if len(outcomes) == 1 else tuple(lim.capacity for lim in policy.limits),
    )


def decide_one(policy: Policy, o: Outcome, now_ms: int) -> Decision:
    """``decide`` for a policy of one rate (the hot path: ``make_decision``'s body, inlined)."""
    d = _DecisionFields()
    d.allowed = allowed = o[0]
    d.limit = policy.limits[0].capacity
    d.remaining = o[1]
    d.reset_at = o[2] / 1000
    d.retry_after = 0.0 if allowed else o[3] / 1000
    d.rate = policy.rates[0]
    d.stack = policy.rates
    d.now = now_ms / 1000
    d.degraded = False
    d.quotas = ()
    d.__class__ = Decision  # type: ignore[assignment]  # same slots: see _DecisionFields
    return d  # type: ignore[return-value]  # a Decision now; cast() would cost a call


def degraded(plan: Plan) -> Decision:
    """The fail-open answer when the store could not be asked: allowed, marked degraded."""
    limit = plan.policy.limits[0]
    calendar = limit.rate.calendar
    ends = plan.now_ms + limit.period_ms if calendar is None else calendar.end_ms(plan.now_ms)
    return make_decision(
        True,
        limit.capacity,
        limit.capacity,
        ends / 1000,
        0.0,
        limit.rate,
        plan.policy.rates,
        plan.now_ms / 1000,
        degraded=True,
    )


def administer(
    policy: Policy, states: Sequence[Any], now_ms: int, op: str, cost: int
) -> tuple[list[Outcome], list[Any], list[Outcome]]:
    """An admin's change of one key's states: what a peek of nothing shows before, the new
    states (None: no state), and the peek after. ``reset`` forgets every state; ``credit``
    gives ``cost`` units back (fixed_window: below zero, so the window holds more than its
    limit: a top-up); ``debit`` charges ``cost`` whether or not it fits."""
    algorithm = policy.algorithm
    before, _ = run_stack(policy, states, now_ms, 0, False)
    if op == "reset":
        new: list[Any] = [None] * len(states)
    elif op == "credit" or op == "debit":
        change = algorithm.credit if op == "credit" else algorithm.debit
        new = [change(s, lim, now_ms, cost) for s, lim in zip(states, policy.limits, strict=True)]
    else:
        raise ConfigError(f"admin op {op!r} is unknown; expected reset, credit or debit")
    after, _ = run_stack(policy, new, now_ms, 0, False)
    return before, new, after
