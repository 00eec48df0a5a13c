"""``LocalBudget``: limits kept in a shared store, decided in process from slices of their budget.

```python
store = LocalBudget(RedisStore("redis://10.0.0.1:6379/0"), sliced=["1000/second"])
limiter = Limiter(store)                  # or AsyncLimiter(store)
```

It wraps a store (``MemoryStore``, ``RedisStore``, ``ShardedRedisStore``,
``RedisClusterStore``) and gives the limiters two capabilities (``stores.base``):

- ``SliceStore``: a hit on a sliced limit (``sliced``: "all" one-rate fixed_window,
  token_bucket and gcra limits, or the rates named, or a function of the ``Policy``) is
  answered from the process's slice of the key's budget (``spend_one``, no plan, no store
  call); when the slice runs out the limiter's plan reaches ``execute``, which takes the next
  slice in one atomic call (``slices.take``) whose reply decides the request. Every other
  plan goes to the wrapped store unchanged. What a slice is, per algorithm, and why the limit
  is never exceeded: ``algorithms.slices``; the local rules: ``slice_book``.
- ``FailLocalStore`` (``fail_local=True``): when the store cannot be asked, ``fail_local``
  decides at the process's share of the limit (``fail_local``), answers marked degraded.

Maintenance rides on the calls: every ``heartbeat`` seconds (of the plans' clock) the next
call first registers the process (``heartbeat``: the live count sizes slices and the
fail-local share) and gives back slices unused for ``idle`` seconds. ``maintain()`` does it
on demand (call it from a timer in a process that may go quiet); ``close()`` gives every
slice back and leaves the count (call it at shutdown: a killed process loses its slices
until they end). The calls of a plan are written once, as a generator (``_steps``), driven by
``execute`` and ``execute_async``. A take that fails is sent again once, at once (its settles
make that safe): one slow reply is not an outage. A ``reset`` is one take with
``Ask.reset``: this process's slices forgotten, the others' kept counted. A forked child
drops what it inherited (``_after_fork``, from ``os.register_at_fork``).

The wrapped store's ``partition`` (one breaker per shard), ``ping`` and ``ping_async`` are
passed through when it has them.
"""

from __future__ import annotations

import logging
import math
import os
import secrets
import socket
import time
import weakref
from collections.abc import Callable, Collection, Generator
from typing import Any

from ..algorithms.base import COUNT_REJECTED, Outcome
from ..algorithms.heartbeat import LiveCount
from ..algorithms.slices import SLICED, Ask, Taken
from ..clock import Clock
from ..errors import ConfigError, StoreUnavailable
from ..metrics.core import Metrics
from ..plan import Plan, Policy, make_plan
from ..rates import Rate, to_rates
from .base import AsyncPingable, Partitioned, Pingable
from .fail_local import FailLocal
from .slice_book import Settle, SliceBook
from .slice_calls import SliceCall, slicer_for

log = logging.getLogger("ratekeeper")

RECOVER_BATCH = 64
"""Debts charged per call after an outage (the decided key's own always first)."""
Call = tuple[str, Any]
"""A store call of ``_steps``: ("take", SliceCall), ("beat", args) or ("plan", Plan) for the
wrapped store."""
Steps = Generator[Call, Any, Any]
Sliced = str | Collection[str | Rate] | Callable[[Policy], bool]

_BUDGETS: weakref.WeakSet[LocalBudget] = weakref.WeakSet()
"""Every ``LocalBudget`` of this process: a forked child drops what it inherited."""


def _forked() -> None:
    for budget in list(_BUDGETS):
        budget._after_fork()


if hasattr(os, "register_at_fork"):  # POSIX; elsewhere the pid check of ``_steps`` alone
    os.register_at_fork(after_in_child=_forked)


def _seconds(name: str, value: object, low: float, high: float) -> int:
    """A duration option in seconds -> whole ms, or a ``ConfigError`` naming it."""
    if (
        isinstance(value, bool)
        or not isinstance(value, int | float)
        or not math.isfinite(value)
        or not low <= value <= high
    ):
        raise ConfigError(f"{name}={value!r} is invalid; expected seconds, {low} to {high}")
    return max(1, round(value * 1000))


def _selection(sliced: Sliced) -> tuple[Callable[[Policy], bool], bool]:
    """``sliced`` -> (does a policy take slices, were limits named). A list names rates: a
    policy with any of them is chosen (a stack that cannot be sliced is then refused loudly)."""
    if sliced == "all":
        return (lambda policy: True), False
    if callable(sliced):
        return sliced, True
    if isinstance(sliced, str) or not isinstance(sliced, Collection):
        raise ConfigError(
            f"sliced={sliced!r} is invalid; expected 'all', rates like ['1000/second'] "
            "or a function of the policy"
        )
    named = {rate for spec in sliced for rate in to_rates(spec)}
    return (lambda policy: any(rate in named for rate in policy.rates)), True


def _unsliceable(policy: Policy) -> str | None:
    """Why ``policy`` cannot take slices, or None."""
    first = policy.limits[0]
    if len(policy.limits) > 1:
        return f"a stack of {len(policy.limits)} rates"
    if policy.algorithm.NAME not in SLICED:
        return f"{policy.algorithm.NAME} is not sliced"
    if first.rate.calendar is not None:
        return "a calendar rate"
    if first.flags & COUNT_REJECTED:
        return "count_rejected"
    return None


class LocalBudget:
    """A store whose limits are decided in process from slices of their budget (see the module)."""

    def __init__(
        self,
        store: Any,
        *,
        sliced: Sliced = "all",
        horizon: float = 0.02,
        max_slice: int | None = None,
        idle: float = 1.0,
        epoch: float = 1.0,
        fail_local: bool = True,
        processes: int | None = None,
        heartbeat: float = 1.0,
        clock: Clock = time.time,
        metrics: Metrics | None = None,
        max_keys: int = 100_000,
    ) -> None:
        self.store = store
        self.slicer = slicer_for(store)
        self._select, self._named = _selection(sliced)
        horizon_ms = _seconds("horizon", horizon, 0.001, 60)
        if max_slice is not None and (
            isinstance(max_slice, bool) or not isinstance(max_slice, int) or max_slice < 1
        ):
            raise ConfigError(f"max_slice={max_slice!r} is invalid; expected a whole number >= 1")
        self._idle_ms = _seconds("idle", idle, 0.001, 3600)
        self._epoch_ms = _seconds("epoch", epoch, 0.01, 3600)
        self._beat_ms = _seconds("heartbeat", heartbeat, 0.01, 3600)
        if processes is not None and (
            isinstance(processes, bool) or not isinstance(processes, int) or processes < 1
        ):
            raise ConfigError(f"processes={processes!r} is invalid; expected a whole number >= 1")
        if not isinstance(max_keys, int) or isinstance(max_keys, bool) or max_keys < 1:
            raise ConfigError(f"max_keys={max_keys!r} is invalid; expected a whole number >= 1")
        if not callable(clock):
            raise ConfigError(f"clock={clock!r} is not callable; expected e.g. time.time")
        if not isinstance(fail_local, bool):
            raise ConfigError(f"fail_local={fail_local!r} is invalid; expected True or False")
        self._max_keys = max_keys
        self.book = SliceBook(horizon_ms, max_slice or 10**12, self._epoch_ms)
        self.fail = FailLocal(max_keys) if fail_local else None
        self.processes = processes
        self.live: int | None = None
        """Processes sharing the store, as the heartbeats count them (``heartbeat.LiveCount``)."""
        self._live = LiveCount(self._beat_ms)
        self.clock = clock
        self._sliced: dict[int, tuple[Policy, bool]] = {}
        self._refused: set[tuple[object, ...]] = set()
        """The limits chosen for slices that cannot take them (each logged once)."""
        self.upkeep_errors = 0
        """Heartbeats and give-backs that failed while the plan's own call could go on."""
        self.retries = 0
        """Takes sent again at once after a failure (see ``_steps``)."""
        self._due = 0
        self._new_process()
        _BUDGETS.add(self)
        if isinstance(store, Partitioned):
            self.partition = store.partition
        if isinstance(store, Pingable):
            self.ping = store.ping
        if isinstance(store, AsyncPingable):
            self.ping_async = store.ping_async
        if metrics is not None:
            metrics.watch_local_budget(self.counters)

    def __repr__(self) -> str:
        return f"LocalBudget({self.store!r})"

    def _new_process(self) -> None:
        self._pid = os.getpid()
        self.process = f"{socket.gethostname()}:{self._pid}:{secrets.token_hex(4)}"

    def _after_fork(self) -> None:
        """In a forked child (called by ``os.register_at_fork``, else at the next store call):
        the parent's slices, pending settles, debts and fail-local state are the parent's to
        spend and give back. Dropped here unspent, so no unit is spent twice or returned
        twice; the child registers as a process of its own at its next call."""
        self.book = SliceBook(self.book.horizon_ms, self.book.max_slice, self._epoch_ms)
        if self.fail is not None:
            self.fail = FailLocal(self._max_keys)
        self.upkeep_errors = self.retries = 0
        self._due = 0
        self._live.lost()  # its first beats may not count everyone yet
        self._new_process()

    # ------------------------------------------------------------ the limiters' capabilities

    def spend_one(
        self, slot: str, key: str, algorithm: Any, limit: Any, now: int, cost: int
    ) -> Outcome | None:
        """A one-rate hit answered from the slice (``SliceStore``), or None: take the plan."""
        h = self.book.held.get((slot, key))
        if h is None or now >= self._due or (h.limit is not limit and h.limit != limit):
            return None
        return self.book.spend(h, now, cost)

    def execute(self, plan: Plan) -> tuple[Outcome, ...]:
        """Run ``plan``: a sliced hit from the slice or with the next take, anything else on
        the wrapped store (see the module)."""
        result: tuple[Outcome, ...] = self._drive(self._steps(plan))
        return result

    async def execute_async(self, plan: Plan) -> tuple[Outcome, ...]:
        """The same as ``execute``, on the wrapped store's asyncio clients."""
        result: tuple[Outcome, ...] = await self._drive_async(self._steps(plan))
        return result

    def fail_local(self, plan: Plan) -> tuple[Outcome, ...] | None:
        """``plan`` decided without the store at this process's share (``FailLocalStore``),
        or None when fail-local is off or no live count is known."""
        fail = self.fail
        if fail is None:
            return None
        if os.getpid() != self._pid:
            self._after_fork()
            fail = self.fail
            assert fail is not None
        self._live.lost()  # nobody may be beating: the next count may be too low
        live = self.live or self.processes
        policy = plan.policy
        sliced = self._is_sliced(policy)
        h = self.book.held.get((policy.slots[0], plan.key)) if sliced else None
        if h is not None and h.limit != policy.limits[0]:  # restated: its slice goes back later
            h = self.book.entry(policy.slots[0], plan.key, policy, plan.now_ms)
        if h is not None and plan.op == "hit":  # what is left of the slice is spent first
            spent = self.book.spend(h, plan.now_ms, plan.cost)
            if spent is not None and spent.allowed:
                return (spent,)
        known = None if h is None else (h.remaining, h.reset_ms)
        answer = fail.decide(plan, known, live)
        if answer is None:
            return None
        outcomes, admitted = answer
        if admitted:
            until = max(o.reset_ms for o in outcomes)
            if sliced:
                held = self.book.entry(policy.slots[0], plan.key, policy, plan.now_ms)
                self.book.owe(held, plan.now_ms, admitted, until)
            else:
                fail.owe(plan, admitted, until)
        return outcomes

    # ------------------------------------------------------------ maintenance

    def maintain(self) -> None:
        """Heartbeat, give back idle slices, charge debts: what the calls do when due."""
        now = int(self.clock() * 1000 + 0.5)
        self._drive(self._upkeep(now, force=True))

    async def maintain_async(self) -> None:
        """The same as ``maintain``, on the asyncio clients."""
        now = int(self.clock() * 1000 + 0.5)
        await self._drive_async(self._upkeep(now, force=True))

    def close(self) -> None:
        """Give every slice back and leave the live count (at shutdown)."""
        now = int(self.clock() * 1000 + 0.5)
        try:
            self._drive(self._leave(now))
        except StoreUnavailable as exc:
            log.warning("ratekeeper: slices not given back at close: %s", exc)

    async def aclose(self) -> None:
        """The same as ``close``, on the asyncio clients."""
        now = int(self.clock() * 1000 + 0.5)
        try:
            await self._drive_async(self._leave(now))
        except StoreUnavailable as exc:
            log.warning("ratekeeper: slices not given back at close: %s", exc)

    def stats(self) -> dict[str, Any]:
        """What the slices and fail-local did, and the live count."""
        c = self.book.counts
        out: dict[str, Any] = {
            "spent": c.spent,
            "local_rejections": c.local_rejections,
            "false_rejections": c.false_rejections,
            "slices_taken": c.slices_taken,
            "units_taken": c.units_taken,
            "slices_returned": c.slices_returned,
            "units_returned": c.units_returned,
            "units_expired": c.units_expired,
            "debt_charged": c.debt_charged,
            "unsliced": len(self._refused),
            "upkeep_errors": self.upkeep_errors,
            "retries": self.retries,
            "keys": len(self.book.held),
            "live": self.live,
        }
        if self.fail is not None:
            out.update(self.fail.stats())
        return out

    def counters(self) -> dict[str, float]:
        """The metric vocabulary's slice and fail-local counters (``Metrics`` reads them)."""
        c = self.book.counts
        fail = self.fail
        return {
            "slices_taken": c.slices_taken,
            "slices_returned": c.slices_returned,
            "units_taken": c.units_taken,
            "units_returned": c.units_returned,
            "units_expired": c.units_expired,
            "false_rejections": c.false_rejections,
            "fail_local_allowed": 0 if fail is None else fail.allowed,
            "fail_local_rejected": 0 if fail is None else fail.rejected,
        }

    # ------------------------------------------------------------ the calls, written once

    def _is_sliced(self, policy: Policy) -> bool:
        found = self._sliced.get(id(policy))
        if found is not None and found[0] is policy:
            return found[1]
        rates = "; ".join(str(r) for r in policy.rates)
        limit = (rates, policy.algorithm.NAME, tuple(lim.flags for lim in policy.limits))
        try:
            chosen = bool(self._select(policy))
        except Exception:  # the caller's function: loud, and the limit decided exactly
            if self._refuse(limit):
                log.exception("ratekeeper: sliced=%r raised; %s decided without slices",
                              self._select, rates)  # fmt: skip
            chosen = False
        why = _unsliceable(policy) if chosen else None
        if why is not None and self._named and self._refuse(limit):
            log.warning(
                "ratekeeper: %s with %s cannot take slices (%s); every decision asks the store",
                rates, policy.algorithm.NAME, why,
            )  # fmt: skip
        if len(self._sliced) > 4096:
            self._sliced.clear()
        ok = chosen and why is None
        self._sliced[id(policy)] = (policy, ok)
        return ok

    def _refuse(self, limit: tuple[object, ...]) -> bool:
        """Count a limit refused slices; True the first time (log it then)."""
        if limit in self._refused or len(self._refused) >= 4096:
            return False
        self._refused.add(limit)
        return True

    def _share(self) -> int:
        return 2 * (self.live or self.processes or 1)

    def _steps(self, plan: Plan) -> Steps:
        if os.getpid() != self._pid:  # a fork the hook did not see
            self._after_fork()
        now = plan.now_ms
        policy = plan.policy
        if self.fail is not None and self.fail.active:
            yield from self._recover(now, (policy.slots[0], plan.key))
        if now >= self._due:
            yield from self._upkeep(now)
        if not self._is_sliced(policy):
            return (yield ("plan", plan))
        slot, key, op, book = policy.slots[0], plan.key, plan.op, self.book
        if op == "hit":
            h = book.entry(slot, key, policy, now)
            outcome = book.spend(h, now, plan.cost)
            if outcome is None:
                ask = book.ask(h, now, plan.cost, self._share())
                try:
                    taken = yield ("take", SliceCall(key, slot, h.name, h.limit, now, ask))
                except StoreUnavailable:
                    book.failed(h, ask, now)  # settled by the next call, whatever happened
                    self.retries += 1  # once, at once: one slow reply is not an outage
                    ask = book.ask(h, now, plan.cost, self._share(), again=True)
                    try:
                        taken = yield ("take", SliceCall(key, slot, h.name, h.limit, now, ask))
                    except StoreUnavailable:
                        book.failed(h, ask, now)
                        raise
                outcome = book.install(h, now, plan.cost, taken, ask)
            return (outcome,)
        name, limit = policy.algorithm.NAME, policy.limits[0]
        if op == "peek":  # through the slices' script: it sees the reservation
            held = book.held.get((slot, key))
            if held is not None and held.limit != limit:  # restated: its slice goes back now
                held = book.entry(slot, key, policy, now)
            settles = book.pending_settles(held, now)  # (writes nothing unless it gives back)
            ask = Ask(plan.cost, plan.cost, 0, settles=settles, epoch_ms=self._epoch_ms)
            taken = yield ("take", SliceCall(key, slot, name, limit, now, ask))
            return (book.peeked(slot, key, now, plan.cost, taken, ask),)
        if op == "refund" and book.refund(slot, key, now, plan.cost):
            return ()
        if op == "reset":  # its slices forgotten; the others' stay counted (slices.restart)
            settles = book.drop(slot, key, now)
            if self.fail is not None:
                self.fail.forget(policy, key)
            ask = Ask(0, 0, 0, settles=settles, epoch_ms=self._epoch_ms, reset=True)
            yield ("take", SliceCall(key, slot, name, limit, now, ask))
            return ()
        return (yield ("plan", plan))

    def _upkeep(self, now: int, force: bool = False) -> Steps:
        if os.getpid() != self._pid:  # maintain() in a fork the hook did not see
            self._after_fork()
        if not force and now < self._due:
            return
        self._due = now + self._beat_ms
        try:
            live = yield ("beat", (self.process, now, now + 3 * self._beat_ms))
            self.live = self._live.heard(now, int(live))
            for settle in self.book.idle(now, self._idle_ms, 64):
                yield from self._give(settle, now)
        except StoreUnavailable as exc:
            self._live.lost()
            if force:  # maintain() reports it
                raise
            # the plan's own call says whether its store answers (the heartbeat's key may be
            # on a shard other than the plan's); what was not given back stays pending
            self.upkeep_errors += 1
            log.debug("ratekeeper: LocalBudget upkeep failed: %s", exc)
        self.book.trim(now, self._max_keys)
        if force and self.fail is not None and self.fail.active:
            yield from self._recover(now)

    def _give(self, s: Settle, now: int) -> Steps:
        h = s.held
        ask = Ask(0, 0, 1, settles=s.settles, epoch_ms=self._epoch_ms)
        taken: Taken = yield ("take", SliceCall(h.key, h.slot, h.name, h.limit, now, ask))
        self.book.settled(s, taken)  # a failure leaves the settles pending: sent again later

    def _recover(self, now: int, first: tuple[str, str] | None = None) -> Steps:
        """Charge the debts of the outage: ``first`` (the key about to be decided from the
        store) before anything else, then up to ``RECOVER_BATCH`` more per call until none is
        left. A sliced key's debt rides in its own next take."""
        fail = self.fail
        assert fail is not None
        debts = fail.debts
        order = list(debts)
        if first is not None and first in order:  # this key's own: its failure is the plan's
            yield from self._charge(first, now)
            order.remove(first)
        try:  # the others: a failure (another shard down) leaves them for a later call
            for k in order[: RECOVER_BATCH - 1]:
                yield from self._charge(k, now)
            for h in self.book.owing(now)[:RECOVER_BATCH]:
                if (h.slot, h.key) == first:
                    continue  # its take carries it
                ask = self.book.claim(h, now)
                try:
                    taken = yield ("take", SliceCall(h.key, h.slot, h.name, h.limit, now, ask))
                except StoreUnavailable:
                    self.book.failed(h, ask, now)
                    fail.active = True  # owed again: recovery is not over
                    raise
                self.book.charged(h, taken, ask)
        except StoreUnavailable as exc:
            if first is None:  # maintain() reports it
                raise
            log.debug("ratekeeper: LocalBudget debts not charged yet: %s", exc)
            return
        if not debts and not self.book.owing(now):
            fail.recovered()

    def _charge(self, k: tuple[str, str], now: int) -> Steps:
        """Charge one unsliced key's debt: a peek, and a hit of what fits (the debt is taken
        out while its calls are on the way, so a concurrent call does not charge it too)."""
        assert self.fail is not None
        debts = self.fail.debts
        debt = debts.pop(k, None)
        if debt is None or debt.until <= now:
            return
        try:
            peek = yield ("plan", make_plan("peek", debt.policy, k[1], now, 1))
            room = min(o.remaining for o in peek)
            units = debt.units if debt.units < room else room
            if units > 0:
                yield ("plan", make_plan("hit", debt.policy, k[1], now, units))
        except StoreUnavailable:
            debts.setdefault(k, debt)  # owed again: if the hit ran after all, it only admits less
            self.fail.active = True
            raise

    def _leave(self, now: int) -> Steps:
        for settle in self.book.give_all(now):
            yield from self._give(settle, now)
        yield ("beat", (self.process, now, 0))

    # ------------------------------------------------------------ the two drivers

    def _call(self, call: Call) -> Any:
        kind, arg = call
        if kind == "take":
            return self.slicer.take(arg)
        if kind == "beat":
            return self.slicer.beat(*arg)
        return self.store.execute(arg)

    async def _call_async(self, call: Call) -> Any:
        kind, arg = call
        if kind == "take":
            return await self.slicer.take_async(arg)
        if kind == "beat":
            return await self.slicer.beat_async(*arg)
        return await self.store.execute_async(arg)

    def _drive(self, steps: Steps) -> Any:
        """Run ``steps``' calls; a failed call is thrown back into them (they note it)."""
        try:
            call = next(steps)
            while True:
                try:
                    result = self._call(call)
                except StoreUnavailable as exc:
                    call = steps.throw(exc)
                else:
                    call = steps.send(result)
        except StopIteration as done:
            return done.value

    async def _drive_async(self, steps: Steps) -> Any:
        """The same as ``_drive``, awaiting each call."""
        try:
            call = next(steps)
            while True:
                try:
                    result = await self._call_async(call)
                except StoreUnavailable as exc:
                    call = steps.throw(exc)
                else:
                    call = steps.send(result)
        except StopIteration as done:
            return done.value
