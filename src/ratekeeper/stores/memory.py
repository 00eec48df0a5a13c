"""``MemoryStore``: the embedded default, running the pure algorithm steps on an OrderedDict.

Thread-safe (one lock around each plan) and asyncio-safe (no await inside a plan), so a stack is
all-or-nothing here exactly as in a Redis script. Memory stays bounded:

- an entry whose state has stopped mattering (``expires_ms`` passed) is replaced when next
  written, and ``sweep()`` (also run on a few entries every ``sweep_every`` keys added) drops
  the rest (only added keys grow the store, so a write to a live key skips the bookkeeping).
  A stale state is still given to the algorithm when read, as a Redis key is until its TTL:
  under the rate it was written for it decides like no state at all, and under a lowered
  rate (a plan changed) it is what is left of the usage;
- leases (the ``LeaseStore`` capability of ``leases``) live in a ``MemoryLeases`` the store
  delegates to, bounded the same way: a key's lease table is dropped when its last lease goes,
  leases that expired unreleased are swept a few keys at a time as keys are added (and all at
  once by ``sweep()``), and at most ``max_keys`` keys hold leases;
- nested calls and reservations (``NestedStore``) run on the same entries, under the same
  lock, in ``nested_memory.MemoryNested``; ``sweep()`` also gives back expired reservations;
- at most ``max_keys`` entries: the least recently used (hit, rejected or peeked) is evicted
  first, so a flood of distinct keys cannot exhaust memory (an evicted key starts fresh — it
  fails open, never closed — but a key that keeps being rejected keeps being used, so a flood
  of other keys does not hand it a fresh quota). The entries live in an ``OrderedDict``, whose
  ``popitem(last=False)`` is O(1): taking the first key of a plain dict scans the slots its
  earlier deletions left empty, which made every hit of a flood O(max_keys) once the store
  was full (230 µs per hit at 100,000 keys).
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

from ..algorithms import Algorithm, Limit, Outcome
from ..algorithms.base import COUNT_REJECTED
from ..nested import NestedPlan, NestedReply
from ..plan import Plan, administer, run_stack
from .leases import MemoryLeases
from .nested_memory import MemoryNested

_Entry = tuple[int, Any]  # (expires_ms, state)
_R = TypeVar("_R")


class MemoryStore:
    """In-process store; the reference semantics every other store must match."""

    def __init__(self, max_keys: int = 1_000_000, sweep_every: int = 1000) -> None:
        if isinstance(max_keys, bool) or not isinstance(max_keys, int) or max_keys < 1:
            raise ValueError(f"max_keys={max_keys!r} is invalid; expected a whole number >= 1")
        self.max_keys = max_keys
        self._sweep_every = sweep_every
        self._added = 0
        self._data: OrderedDict[tuple[str, str], _Entry] = OrderedDict()
        self._lock = threading.Lock()
        self._leases = MemoryLeases(max_keys)
        self._nested = MemoryNested(self)

    def __len__(self) -> int:
        return len(self._data)

    @property
    def leases(self) -> MemoryLeases:
        """The leases (``len(store.leases)``: keys holding leases)."""
        return self._leases

    def execute(self, plan: Plan) -> tuple[Outcome, ...]:
        """Run one plan under the lock."""
        policy = plan.policy
        if plan.op != "hit" or len(policy.slots) != 1:
            return self._execute(plan)
        return (
            self.hit_one(
                policy.slots[0],
                plan.key,
                policy.algorithm,
                policy.limits[0],
                plan.now_ms,
                plan.cost,
            ),
        )

    def hit_one(
        self, slot: str, key: str, algorithm: Algorithm, limit: Limit, now: int, cost: int
    ) -> Outcome:
        """A hit on one rate (``LocalStore``): ``execute``'s common case, also called by the
        limiters directly so that it needs no ``Plan``; the same steps as ``_execute``. A
        subclass that overrides ``execute`` must override this too."""
        k = (slot, key)
        data = self._data
        lock = self._lock
        lock.acquire()  # not ``with``: acquire/try/finally measured ~90 ns cheaper per call
        try:
            entry = data.get(k)
            # a stale state (its expiry passed) decides like none under the rate it was written
            # for, and as what is left of it under a changed one (a lowered limit)
            state = None if entry is None else entry[1]
            outcome, new = algorithm.step(state, limit, now, cost, True)
            # _write, inlined (the hot path); a count_rejected rejection is charged too
            if outcome[0] or limit.flags & COUNT_REJECTED:
                data[k] = (outcome[2], new)  # reset_ms: expires_ms(new), see algorithms/base
                if entry is None:
                    self._grew(now)
                else:
                    data.move_to_end(k)  # the order is least recently used first
            elif entry is not None:  # a rejection is a use too: move the live entry to the end
                if new is not state:  # restated under a changed rate (gcra): keep that
                    data[k] = (outcome[2], new)
                elif outcome[2] > entry[0]:  # a limit lowered since: the state matters longer
                    data[k] = (outcome[2], entry[1])
                data.move_to_end(k)
        finally:
            lock.release()
        return outcome

    def _execute(self, plan: Plan) -> tuple[Outcome, ...]:
        """Any plan: stacks, peeks, refunds and resets."""
        policy = plan.policy
        now = plan.now_ms
        keys = [(slot, plan.key) for slot in policy.slots]
        with self._lock:
            data = self._data
            if plan.op == "reset":
                for k in keys:
                    data.pop(k, None)
                return ()
            states = []
            for k in keys:  # stale states too: see hit_one
                entry = data.get(k)
                states.append(None if entry is None else entry[1])
            algorithm = policy.algorithm
            if plan.op == "refund":
                for k, state, limit in zip(keys, states, policy.limits, strict=True):
                    new = algorithm.refund(state, limit, now, plan.cost)
                    expires = 0 if new is None else algorithm.expires_ms(new, limit)
                    if expires > now:
                        self._write(k, expires, new, now)
                    else:  # nothing left that matters (e.g. an empty log): keep no entry
                        data.pop(k, None)
                return ()
            restated: list[tuple[int, Any]] = []
            hit = plan.op == "hit"
            outcomes, new_states = run_stack(
                policy, states, now, plan.cost, hit, restated if hit else None
            )
            if new_states is not None:
                for k, new, limit in zip(keys, new_states, policy.limits, strict=True):
                    self._write(k, algorithm.expires_ms(new, limit), new, now)
            else:  # a rejection or a peek is a use too: a key that keeps knocking stays cached
                for i, new in restated:  # a state restated under a changed rate (gcra)
                    self._write(keys[i], outcomes[i][2], new, now)
                for k, outcome in zip(keys, outcomes, strict=True):
                    entry = data.get(k)
                    if entry is not None:
                        if hit and outcome[2] > entry[0]:  # a lowered limit: it matters longer
                            data[k] = (outcome[2], entry[1])
                        data.move_to_end(k)
            return tuple(outcomes)

    def administer(self, plan: Plan) -> tuple[tuple[Outcome, ...], tuple[Outcome, ...]]:
        """An admin's reset, credit or debit (``plan.op``) under the lock: the outcomes of a
        peek of nothing before and after (``AdminStore``)."""
        policy = plan.policy
        now = plan.now_ms
        keys = [(slot, plan.key) for slot in policy.slots]
        with self._lock:
            data = self._data
            states = []
            for k in keys:  # stale states too: see hit_one
                entry = data.get(k)
                states.append(None if entry is None else entry[1])
            before, new, after = administer(policy, states, now, plan.op, plan.cost)
            for k, state, limit in zip(keys, new, policy.limits, strict=True):
                expires = 0 if state is None else policy.algorithm.expires_ms(state, limit)
                if expires > now:
                    self._write(k, expires, state, now)
                else:
                    data.pop(k, None)
        return tuple(before), tuple(after)

    async def administer_async(self, plan: Plan) -> tuple[tuple[Outcome, ...], tuple[Outcome, ...]]:
        """The same as ``administer``: nothing in it blocks."""
        return self.administer(plan)

    def execute_many(self, plans: list[Plan]) -> list[tuple[Outcome, ...]]:
        """Several plans, one after the other (``ManyStore``: ``status``'s peeks)."""
        return [self.execute(plan) for plan in plans]

    async def execute_many_async(self, plans: list[Plan]) -> list[tuple[Outcome, ...]]:
        """The same as ``execute_many``."""
        return self.execute_many(plans)

    async def execute_async(self, plan: Plan) -> tuple[Outcome, ...]:
        """The same as ``execute``: nothing in it blocks."""
        return self.execute(plan)

    def execute_nested(self, plan: NestedPlan) -> NestedReply:
        """Run one nested call or reservation step atomically (``NestedStore``)."""
        return self._nested.execute(plan)

    async def execute_nested_async(self, plan: NestedPlan) -> NestedReply:
        """The same as ``execute_nested``: nothing in it blocks."""
        return self._nested.execute(plan)

    @property
    def reservations(self) -> MemoryNested:
        """The reservations (``len(store.reservations)``: live ones and tombstones)."""
        return self._nested

    def transact(
        self,
        keys: Sequence[tuple[str, str]],
        now_ms: int,
        change: Callable[[list[Any]], tuple[_R, Sequence[_Entry | None] | None]],
    ) -> _R:
        """Run ``change`` over the live states of ``keys`` ((slot, caller key) pairs; None
        when missing) under the lock: an atomic read-modify-write, what a Lua script is to
        Redis (``local_budget``'s slices and heartbeats run here in process). ``change``
        returns its result and, per key, the entry to write ((expires_ms, state); None, or an
        expiry not after ``now_ms``, deletes), or None to write nothing."""
        with self._lock:
            data = self._data
            states = []
            for k in keys:
                entry = data.get(k)
                if entry is not None and entry[0] <= now_ms:
                    del data[k]
                    entry = None
                states.append(None if entry is None else entry[1])
            result, writes = change(states)
            if writes is not None:
                for k, write in zip(keys, writes, strict=True):
                    if write is None or write[0] <= now_ms:  # ended: the same as no state
                        data.pop(k, None)
                    else:
                        self._write(k, write[0], write[1], now_ms)
            return result

    def ping(self) -> None:
        """Always answers (in-process); here so every store can be checked the same way."""

    async def ping_async(self) -> None:
        """The same as ``ping``."""

    def acquire_lease(
        self, key: str, lease_id: str, capacity: int, now_ms: int, expires_ms: int
    ) -> tuple[bool, int]:
        """Sweep, count and add one lease atomically (``LeaseStore``)."""
        return self._leases.acquire_lease(key, lease_id, capacity, now_ms, expires_ms)

    def release_lease(self, key: str, lease_id: str, now_ms: int) -> bool:
        """Remove one lease (``LeaseStore``)."""
        return self._leases.release_lease(key, lease_id, now_ms)

    def count_leases(self, key: str, now_ms: int) -> int:
        """Live leases of ``key`` (``LeaseStore``)."""
        return self._leases.count_leases(key, now_ms)

    async def acquire_lease_async(
        self, key: str, lease_id: str, capacity: int, now_ms: int, expires_ms: int
    ) -> tuple[bool, int]:
        """The same as ``acquire_lease``: nothing in it blocks."""
        return self._leases.acquire_lease(key, lease_id, capacity, now_ms, expires_ms)

    async def release_lease_async(self, key: str, lease_id: str, now_ms: int) -> bool:
        """The same as ``release_lease``."""
        return self._leases.release_lease(key, lease_id, now_ms)

    async def count_leases_async(self, key: str, now_ms: int) -> int:
        """The same as ``count_leases``."""
        return self._leases.count_leases(key, now_ms)

    def _load(self, key: tuple[str, str], now_ms: int) -> Any:
        """The state of ``key``, or None; the lock is held. A stale state too, as ``hit_one``
        reads it (it decides like none under its own rate, and as what is left of the usage
        under a lowered one)."""
        entry = self._data.get(key)
        return None if entry is None else entry[1]

    def _touch(self, keys: list[tuple[str, str]]) -> None:
        """Mark live entries used (a rejection or a peek); the lock is held."""
        data = self._data
        for k in keys:
            if k in data:
                data.move_to_end(k)

    def _drop(self, key: tuple[str, str]) -> None:
        self._data.pop(key, None)

    def _write(self, key: tuple[str, str], expires_ms: int, state: Any, now_ms: int) -> None:
        data = self._data
        if key in data:
            data[key] = (expires_ms, state)
            data.move_to_end(key)  # the order is least recently used first
        else:
            data[key] = (expires_ms, state)  # a new key goes last, most recently used
            self._grew(now_ms)

    def _grew(self, now_ms: int) -> None:
        """A key was added: evict the least recently used past ``max_keys``, and sweep a few
        entries every ``sweep_every`` additions."""
        data = self._data
        if len(data) > self.max_keys:
            data.popitem(last=False)
        self._added += 1
        if self._added >= self._sweep_every:
            self._added = 0
            self._sweep_some(now_ms, budget=64)

    def _sweep_some(self, now_ms: int, budget: int) -> None:
        data = self._data
        stale = [k for k, (exp, _) in _head(data, budget) if exp <= now_ms]
        for k in stale:
            del data[k]

    def sweep(self, now: float) -> int:
        """Drop every entry (and lease) whose state stopped mattering by epoch second ``now``,
        after giving back the estimates of reservations expired by then."""
        now_ms = round(now * 1000)
        with self._lock:
            dropped = self._nested.sweep_all(now_ms)
            stale = [k for k, (exp, _) in self._data.items() if exp <= now_ms]
            for k in stale:
                del self._data[k]
        return len(stale) + dropped + self._leases.sweep(now_ms)


def _head(
    data: OrderedDict[tuple[str, str], _Entry], n: int
) -> list[tuple[tuple[str, str], _Entry]]:
    out = []
    for item in data.items():
        out.append(item)
        if len(out) >= n:
            break
    return out
