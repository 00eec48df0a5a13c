"""``FailLocal``: decisions without the store, each process at its share of every limit.

When the store cannot be asked (an error, a timeout, an open circuit breaker), a
``LocalBudget`` built with ``fail_local=True`` decides in process instead of failing open or
closed: every limit is divided by ``live``, the number of processes sharing the store (what
the last heartbeat answered, or ``processes`` before any), and the answers are marked
``degraded``. Sans-I/O: decisions run on a private ``MemoryStore``.

- **The share** (``share_policy``): fixed_window, sliding_window and sliding_log allow
  ``count // live`` (at least 1) per period; token_bucket and gcra refill at the rate divided by
  ``live`` exactly (the same count per ``live`` periods) with ``burst // live`` (at least 1).
- **The window in progress**: a sliced key starts from what this process last heard from the
  store: its share of what the store had left (``remaining // live``), in the store's window
  (fixed_window) or as the bucket's level, unless what it admitted here earlier (in this
  outage, or an earlier one whose state has not ended) leaves it less; any other key starts
  with a full share.
- **Debt**: every unit admitted here is remembered per key until its local state stops
  mattering (``Debt``; at most ``max_keys`` of them), and charged to the store when it answers
  again, never past empty: a key's own debt before anything is decided for it from the store
  (a sliced key's rides in its next ``take``; other keys are charged with a ``peek`` and a
  ``hit`` of what fits), the others a batch per call. So the decisions of the outage count,
  and the store's return is no burst.
- **After the return** the local state stays until it ends by itself (a window's end, a
  bucket refilled): a process still deciding here (its breaker cooling down, a later outage
  in the same window) goes on from what it admitted, never from a fresh share.

What that admits (the slack ``docs/local_budget.md`` states): in windows wholly inside the
outage each process admits at most its share, so all together at most the limit (times the
processes serving over ``live``, if more serve than the last heartbeat counted); the window in
which the store was lost can admit what the store had counted plus the processes' shares of
what they last heard was left; the window in which it returns, the limit plus the debts of
processes that have not yet reached it. At most twice the limit per window.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..algorithms.base import Limit, Outcome
from ..errors import RateSpecError
from ..plan import Plan, Policy, make_plan, make_policy
from ..rates import Rate
from .memory import MemoryStore


@dataclass(slots=True)
class Debt:
    """Units a key admitted without the store, under ``policy``, until ``until`` (epoch ms)."""

    policy: Policy
    units: int
    until: int


def share_policy(policy: Policy, live: int) -> Policy:
    """``policy`` with every limit divided by ``live`` processes (see the module)."""
    name = policy.algorithm.NAME
    first = policy.limits[0]
    stretch = name in ("token_bucket", "gcra")
    rates = tuple(_share(limit, live, stretch) for limit in policy.limits)
    burst = max(1, first.capacity // live) if stretch else None
    return make_policy(
        rates,
        name,
        burst,
        first.buckets if name == "sliding_window" else None,
        bool(first.flags & 1) if name == "fixed_window" else False,
        bool(first.flags & 2) if name == "fixed_window" else False,
    )


def _share(limit: Limit, live: int, stretch: bool) -> Rate:
    rate = limit.rate
    if stretch:
        try:
            return Rate(rate.count, rate.period * live)
        except RateSpecError:  # past ten years: the count divided instead
            pass
    return Rate(max(1, rate.count // live), rate.period)


def seed(name: str, local: Limit, now: int, remaining: int, reset_ms: int, live: int) -> object:
    """The local state of a sliced key at the outage: its share of what the store last had."""
    share = remaining // live
    if share > local.capacity:
        share = local.capacity
    if name == "fixed_window":
        return (local.count - share, reset_ms) if reset_ms > now else None
    if name == "token_bucket":  # what the bucket lacks
        return ((local.capacity - share) * local.period_ms, now)
    return (now * 1000 + (local.capacity - share) * local.unit, local.count)  # gcra's (tat, count)


class FailLocal:
    """Local decisions while the store is unreachable, and their debts (see the module)."""

    def __init__(self, max_keys: int) -> None:
        self.memory = MemoryStore(max_keys=max_keys)
        self.debts: dict[tuple[str, str], Debt] = {}
        """Debts of keys without slices (a sliced key keeps its own, in its ``Held``)."""
        self.active = False
        """Decisions were made here since the store last answered."""
        self.allowed = 0
        self.rejected = 0
        self.unknown = 0
        """Failures with no live count known: left to the limiter's fail_open."""
        self.dropped = 0
        """Debts forgotten to keep at most ``max_keys`` (their keys may burst on return)."""
        self._policies: dict[tuple[int, int], tuple[Policy, Policy]] = {}

    def policy(self, policy: Policy, live: int) -> Policy:
        """The local share of ``policy`` (cached)."""
        found = self._policies.get((id(policy), live))
        if found is None or found[0] is not policy:
            if len(self._policies) > 4096:
                self._policies.clear()
            found = (policy, share_policy(policy, live))
            self._policies[(id(policy), live)] = found
        return found[1]

    def decide(
        self, plan: Plan, known: tuple[int, int] | None, live: int | None
    ) -> tuple[tuple[Outcome, ...], int] | None:
        """``plan`` decided locally at a share of ``live`` processes (``known``: the store's
        remaining and reset_ms at this process's last take of the key, for a sliced key); the
        outcomes and the units it admitted, or None when no live count is known."""
        if live is None:
            self.unknown += 1
            return None
        self.active = True
        policy = self.policy(plan.policy, live)
        local = make_plan(plan.op, policy, plan.key, plan.now_ms, plan.cost)
        if known is not None and plan.op == "hit":
            self._seed(policy, plan, known, live)
        outcomes = self.memory.execute(local)
        if plan.op != "hit":
            return outcomes, 0
        if all(o.allowed for o in outcomes):
            self.allowed += 1
            return outcomes, plan.cost
        self.rejected += 1
        return outcomes, 0

    def _seed(self, policy: Policy, plan: Plan, known: tuple[int, int], live: int) -> None:
        slot, name = policy.slots[0], policy.algorithm.NAME
        state = seed(name, policy.limits[0], plan.now_ms, known[0], known[1], live)
        if state is None:
            return

        limit, peek = policy.limits[0], policy.algorithm.step

        def change(states: list[object]) -> tuple[None, list[tuple[int, object]] | None]:
            old = states[0]  # seeded already, or what was admitted here in an earlier outage
            if old is not None and (
                peek(old, limit, plan.now_ms, 1, False)[0].remaining
                <= peek(state, limit, plan.now_ms, 1, False)[0].remaining
            ):
                return None, None  # the state with less room stays
            return None, [(policy.algorithm.expires_ms(state, limit), state)]

        self.memory.transact([(slot, plan.key)], plan.now_ms, change)

    def owe(self, plan: Plan, units: int, until: int) -> None:
        """Remember units a key without slices admitted here."""
        k = (plan.policy.slots[0], plan.key)
        debts = self.debts
        debt = debts.get(k)
        if debt is None or debt.until <= plan.now_ms:
            if debt is None and len(debts) >= self.memory.max_keys:  # bounded: the oldest goes
                debts.pop(next(iter(debts)))
                self.dropped += 1
            debts[k] = Debt(plan.policy, units, until)
        else:
            debt.units += units
            debt.until = max(debt.until, until)

    def recovered(self) -> None:
        """The store answers again and every debt is charged. The local state is kept until
        it ends by itself: a limiter whose breaker still cools down decides here a while
        longer, and must go on from what it admitted, not from a second share."""
        self.active = False

    def forget(self, policy: Policy, key: str) -> None:
        """The key was reset: its local state and debt go."""
        self.debts.pop((policy.slots[0], key), None)
        self.memory.execute(make_plan("reset", policy, key, 0, 1))

    def stats(self) -> dict[str, int]:
        """Local decisions made, and failures left to the limiter for want of a live count."""
        return {
            "fail_local_allowed": self.allowed,
            "fail_local_rejected": self.rejected,
            "fail_local_unknown": self.unknown,
            "debts_dropped": self.dropped,
        }
