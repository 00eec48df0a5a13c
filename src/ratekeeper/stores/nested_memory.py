"""Nested calls and reservations in the memory store: the reference ``nested.lua`` must match.

``MemoryNested`` runs a ``NestedPlan`` on its ``MemoryStore``'s entries under the store's lock
(so a nested call is atomic beside plain plans, which share level 0's counters): it sweeps
expired reservations, then decides all levels (``nested.run_levels``) and writes only if every
level admits, or settles. Reservations are kept here, by (outer key, id):

- a live one holds its levels, estimate and reserve time, and is due at its expiry;
- a settled or cancelled one is a tombstone, due when it is forgotten (``keep_ms`` after);
- each call first takes up to ``SWEEP`` due entries, oldest first, from one heap over every
  outer key: a live one gives its estimate back where it was charged. (``nested.lua`` sweeps
  per outer key, as a Redis script must; an estimate comes back before the next call that
  reads its counters either way, and giving it back later changes no decision — a refund at
  any time before the next read leaves the same state to read.) ``sweep_all`` takes them all.
"""

from __future__ import annotations

import heapq
import threading
from dataclasses import dataclass
from typing import Any, Protocol

from ..nested import NestedPlan, NestedReply, Tier, counter, run_levels

SWEEP = 32
"""Due reservations handled per call (the same bound as ``nested.lua``)."""


@dataclass(slots=True)
class _Record:
    """A reservation: live (``levels`` set, with the ``reset_ms`` each rate's charge answered:
    ``marks``) or a tombstone (``levels`` None)."""

    due_ms: int
    levels: tuple[Tier, ...] | None
    estimate: int
    since_ms: int
    marks: tuple[tuple[int, ...], ...] = ()


class Entries(Protocol):
    """What a nested call uses of its ``MemoryStore`` (``memory`` imports this module): the
    lock and its entries, read and written with the lock held."""

    _lock: threading.Lock

    def _load(self, key: tuple[str, str], now_ms: int) -> Any: ...
    def _touch(self, keys: list[tuple[str, str]]) -> None: ...
    def _drop(self, key: tuple[str, str]) -> None: ...
    def _write(self, key: tuple[str, str], expires_ms: int, state: Any, now_ms: int) -> None: ...


class MemoryNested:
    """The nested calls and reservations of one ``MemoryStore`` (see the module docstring)."""

    def __init__(self, store: Entries) -> None:
        self.store = store
        self.records: dict[tuple[str, str], _Record] = {}
        self._due: list[tuple[int, str, str]] = []  # (due_ms, outer key, id); stale ones skipped

    def __len__(self) -> int:
        return len(self.records)

    def execute(self, plan: NestedPlan) -> NestedReply:
        """Run one nested plan atomically (under the store's lock)."""
        now = plan.now_ms
        with self.store._lock:
            self._sweep(now, SWEEP)
            if plan.op in ("hit", "peek", "reserve"):
                return self._decide(plan)
            if plan.op == "refund":
                for tier in plan.levels:
                    self._refund(tier, now)
                return (1, ())
            return (self._settle(plan), ())

    def sweep_all(self, now_ms: int) -> int:
        """Give back every expired reservation and forget every due tombstone (the store's
        lock held); the number of reservations dropped."""
        return self._sweep(now_ms, len(self._due))

    def _sweep(self, now: int, budget: int) -> int:
        due, records = self._due, self.records
        done = 0
        while due and due[0][0] <= now and done < budget:
            due_ms, outer, rid = heapq.heappop(due)
            record = records.get((outer, rid))
            if record is None or record.due_ms != due_ms:
                continue  # settled since (re-queued) or already gone
            del records[(outer, rid)]
            done += 1
            if record.levels is not None:  # expired: its estimate goes back
                for tier, marks in zip(record.levels, record.marks, strict=True):
                    self._give(tier, -record.estimate, record.since_ms, marks, now)
        return done

    def _decide(self, plan: NestedPlan) -> NestedReply:
        now = plan.now_ms
        if plan.op == "reserve" and (plan.key, plan.rid) in self.records:
            return (-1, ())
        store = self.store
        names = [[counter(t, slot) for slot in t.policy.slots] for t in plan.levels]
        states = [[store._load(k, now) for k in keys] for keys in names]
        allowed, outcomes, new = run_levels(plan, states, plan.op != "peek")
        if allowed and plan.op != "peek":
            for tier, keys, tier_states in zip(plan.levels, names, new, strict=True):
                if tier.cost == 0:
                    continue
                algorithm = tier.policy.algorithm
                for k, state, limit in zip(keys, tier_states, tier.policy.limits, strict=True):
                    store._write(k, algorithm.expires_ms(state, limit), state, now)
            if plan.op == "reserve":
                settling = [i for i, t in enumerate(plan.levels) if t.settles]
                record = _Record(
                    now + plan.amount,
                    tuple(plan.levels[i] for i in settling),
                    plan.levels[settling[0]].cost if settling else 0,
                    now,
                    tuple(tuple(o.reset_ms for o in outcomes[i]) for i in settling),
                )
                self._put(plan.key, plan.rid, record)
        else:  # a rejection or a peek is a use too: keys that keep knocking stay cached
            for keys in names:
                store._touch(keys)
        return (1 if allowed else 0, tuple(tuple(o) for o in outcomes))

    def _settle(self, plan: NestedPlan) -> int:
        now = plan.now_ms
        record = self.records.get((plan.key, plan.rid))
        if record is not None and record.levels is None:
            return 2
        actual = plan.amount if plan.op == "settle" else 0
        if record is not None:
            assert record.levels is not None
            for tier, marks in zip(record.levels, record.marks, strict=True):
                self._give(tier, actual - record.estimate, record.since_ms, marks, now)
            status = 1
        else:
            if plan.op == "settle":  # expired or never issued: the actual cost, now
                for tier in plan.levels:
                    if tier.settles:
                        self._give(tier, actual, now, (0,) * len(tier.debts), now)
            status = 3
        self._put(plan.key, plan.rid, _Record(now + plan.keep_ms, None, 0, now))
        return status

    def _refund(self, tier: Tier, now: int) -> None:
        """Give ``tier.cost`` back on every rate (each algorithm's ``refund``, as ``refund``
        does for one key: never below empty or above full)."""
        if tier.cost == 0:
            return
        store = self.store
        algorithm = tier.policy.algorithm
        for slot, limit in zip(tier.policy.slots, tier.policy.limits, strict=True):
            k = counter(tier, slot)
            state = store._load(k, now)
            new = algorithm.refund(state, limit, now, tier.cost)
            expires = 0 if new is None else algorithm.expires_ms(new, limit)
            if expires > now:
                store._write(k, expires, new, now)
            else:
                store._drop(k)

    def _give(
        self, tier: Tier, delta: int, since_ms: int, marks: tuple[int, ...], now: int
    ) -> None:
        """Settle ``delta`` units on every rate of ``tier`` (each algorithm's ``settle``)."""
        if delta == 0:
            return
        store = self.store
        policy = tier.policy
        algorithm = policy.algorithm
        for slot, limit, debt, mark in zip(
            policy.slots, policy.limits, tier.debts, marks, strict=True
        ):
            k = counter(tier, slot)
            state = store._load(k, now)
            new: Any = algorithm.settle(state, limit, now, delta, since_ms, mark, debt)
            if new is not state:
                expires = 0 if new is None or new == () else algorithm.expires_ms(new, limit)
                if expires > now:
                    store._write(k, expires, new, now)
                else:
                    store._drop(k)

    def _put(self, outer: str, rid: str, record: _Record) -> None:
        self.records[(outer, rid)] = record
        heapq.heappush(self._due, (record.due_ms, outer, rid))
