"""The sans-I/O core: calls become ``Plan`` data, store replies become ``Decision``s.

Nothing here does I/O, so ``Limiter`` and ``AsyncLimiter`` share it and differ only in how they
execute a plan, and the service can run many plans in one Redis pipeline.

- ``Policy``: rates + algorithm + options, validated once and cached by the limiter; ``slots``
  name each rate's state (algorithm code, state-shaping options, rate) for store keys.
- ``Plan``: one operation (``hit``/``peek``/``refund``/``reset``) on one caller key at one time.
- ``run_stack``: the all-or-nothing stack rule over the pure algorithm steps (memory store).
- ``decide``: outcomes of every rate -> the one ``Decision`` the caller sees.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal

from .algorithms import ALGORITHMS, Algorithm, Limit, Outcome
from .algorithms.base import COUNT_REJECTED
from .decision import Decision, _DecisionFields, make_decision
from .errors import ConfigError, RateSpecError
from .rates import Rate, to_rates

Op = Literal["hit", "peek", "refund", "reset"]


@dataclass(frozen=True, slots=True)
class Policy:
    """A validated stack of rates under one algorithm."""

    algorithm: Algorithm
    limits: tuple[Limit, ...]
    slots: tuple[str, ...]
    rates: tuple[Rate, ...]


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
) -> Policy:
    """Validate rates, algorithm and options; raise a ``ValueError`` naming what is wrong.

    ``aligned`` and ``count_rejected`` are fixed_window's (False means not given)."""
    module = ALGORITHMS.get(algorithm) if isinstance(algorithm, str) else None
    if module is None:
        raise ConfigError(
            f"algorithm {algorithm!r} is unknown; expected one of {', '.join(sorted(ALGORITHMS))}"
        )
    options: dict[str, int] = {}
    given = (("burst", burst), ("buckets", buckets))
    for name, value in (*given, ("aligned", aligned), ("count_rejected", count_rejected)):
        if value is None or value is False:
            continue
        if name not in module.OPTIONS:
            takes = ", ".join(sorted(module.OPTIONS)) or "no options"
            raise ConfigError(f"option {name!r} does not apply to {algorithm}; it takes {takes}")
        options[name] = value
    stack = to_rates(rates)
    limits = tuple(module.make_limit(r, options) for r in stack)
    first = limits[0]
    if module.NAME == "sliding_window" and first.buckets > 1:
        slots = tuple(f"{module.CODE}{first.buckets}:{r.code}" for r in stack)
    elif first.flags & COUNT_REJECTED:  # the counter counts hits whatever the limit
        periods = [r.code.split("/")[1] for r in stack]
        if len(set(periods)) != len(periods):
            raise ConfigError(
                f"rates {', '.join(str(r) for r in stack)} repeat a period; with "
                "count_rejected the rates of one period share one counter, so give each "
                "period once"
            )
        slots = tuple(f"{module.CODE}{first.flags}:{p}" for p in periods)
    else:
        shape = f"{first.flags}" if first.flags else ""
        slots = tuple(f"{module.CODE}{shape}:{r.code}" for r in stack)
    return Policy(module, limits, slots, stack)


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
    policy: Policy, states: Sequence[Any], now_ms: int, cost: int, charge: bool
) -> tuple[list[Outcome], list[Any] | None]:
    """Step every rate; return the outcomes and, if all admit (or the policy counts rejected
    hits too) and ``charge``, the new states."""
    step = policy.algorithm.step
    outcomes: list[Outcome] = []
    new_states: list[Any] = []
    for state, limit in zip(states, policy.limits, strict=True):
        outcome, new_state = step(state, limit, now_ms, cost, charge)
        outcomes.append(outcome)
        new_states.append(new_state)
    if charge and (all(o.allowed for o in outcomes) or policy.limits[0].flags & COUNT_REJECTED):
        return outcomes, new_states
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
    return make_decision(
        True,
        limit.capacity,
        limit.capacity,
        (plan.now_ms + limit.period_ms) / 1000,
        0.0,
        limit.rate,
        plan.policy.rates,
        plan.now_ms / 1000,
        degraded=True,
    )
