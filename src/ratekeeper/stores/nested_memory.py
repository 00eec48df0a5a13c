"""Nested calls and reservations in the memory store: the reference ``nested.lua`` must match.

``MemoryNested`` runs a ``NestedPlan`` on its ``MemoryStore``'s entries under the store's lock
(so a nested call is atomic beside plain plans, which share level 0's counters): it sweeps
expired reservations, then decides all levels (``nested.run_levels``) and writes only if every
level admits, or settles. Reservations are kept here, by (outer key, id), each outer key's in
a ``_Book`` (what ``nested.lua`` keeps in the hash ``R`` and sorted set ``Z`` of its tag):

- a live one holds its levels, estimate and reserve time, and is due at its expiry;
- a settled or cancelled one is a tombstone, due when it is forgotten (``keep_ms`` after);
- each call first takes up to ``SWEEP`` due entries of its own outer key, oldest first (as
  ``nested.lua`` does): a live one gives its estimate back where it was charged. Another
  key's entries wait for that key's call, so every key sees its expired estimates back on its
  first call, exactly as on Redis, whatever other keys have due; ``sweep_all`` takes them all;
- a book untouched by a reserve or settle for as long as ``nested.lua`` sets ``R`` and ``Z`` to
  live (``hold_ms``, or past its latest due) is forgotten whole, as Redis drops the two keys:
  by then its estimates have nothing left to give back to, and memory stays bounded.
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


@dataclass(slots=True)
class _Book:
    """One outer key's reservations: ``due``, a heap of (due_ms, id) (an entry whose record was
    settled since, or is gone, is skipped), how many records it holds (none: the book goes,
    as Redis deletes an empty R and Z), the latest due put in it (``top``), and when it is
    forgotten whole unless a reserve or settle touches it (``expires_ms``: R and Z's TTL)."""

    due: list[tuple[int, str]]
    count: int = 0
    top: int = 0
    expires_ms: int = 0
    queued: int = 0
    """The time its entry in ``MemoryNested._expiring`` holds (one entry per book, moved on
    when it comes due before ``expires_ms``)."""


class MemoryNested:
    """The nested calls and reservations of one ``MemoryStore`` (see the module docstring)."""

    def __init__(self, store: Entries) -> None:
        self.store = store
        self.records: dict[tuple[str, str], _Record] = {}
        self.books: dict[str, _Book] = {}
        self._expiring: list[tuple[int, str]] = []  # (expires_ms, outer key); stale ones skipped

    def __len__(self) -> int:
        return len(self.records)

    def execute(self, plan: NestedPlan) -> NestedReply:
        """Run one nested plan atomically (under the store's lock)."""
        now = plan.now_ms
        with self.store._lock:
            if self._expiring and self._expiring[0][0] <= now:
                self._forget(now, SWEEP)
            book = self.books.get(plan.key)
            if book is not None:
                if book.expires_ms <= now:  # R and Z would be gone: nothing comes back
                    self._drop(plan.key)
                elif book.due[0][0] <= now:  # (a book holds a record: its heap has entries)
                    self._sweep(plan.key, book, now, SWEEP)
            if plan.op in ("hit", "peek", "reserve"):
                return self._decide(plan)
            if plan.op == "refund":
                for tier in plan.levels:
                    self._refund(tier, now)
                return (1, ())
            return (self._settle(plan), ())

    def sweep_all(self, now_ms: int) -> int:
        """Give back every expired reservation and forget every due tombstone and every book
        past its time (the store's lock held); the number of reservations dropped."""
        before = len(self.records)
        self._forget(now_ms, len(self._expiring))
        for outer, book in list(self.books.items()):
            self._sweep(outer, book, now_ms, len(book.due))
        return before - len(self.records)

    def _forget(self, now: int, budget: int) -> None:
        """Drop up to ``budget`` books whose time has come, whole."""
        expiring, books = self._expiring, self.books
        while expiring and expiring[0][0] <= now and budget > 0:
            at, outer = heapq.heappop(expiring)
            book = books.get(outer)
            if book is None or book.queued != at:
                continue  # a book gone, or a later one of that key (queued on its own)
            if book.expires_ms <= now:
                self._drop(outer)
                budget -= 1
            else:  # touched since it was queued: queued again at its time
                book.queued = book.expires_ms
                heapq.heappush(expiring, (book.expires_ms, outer))

    def _drop(self, outer: str) -> None:
        book = self.books.pop(outer)
        for _, rid in book.due:
            self.records.pop((outer, rid), None)

    def _sweep(self, outer: str, book: _Book, now: int, budget: int) -> None:
        """Take up to ``budget`` of ``outer``'s due entries: an expired reservation's estimate
        goes back, a due tombstone is forgotten."""
        due, records = book.due, self.records
        done = 0
        while due and due[0][0] <= now and done < budget:
            due_ms, rid = heapq.heappop(due)
            record = records.get((outer, rid))
            if record is None or record.due_ms != due_ms:
                continue  # settled since (re-queued) or already gone
            del records[(outer, rid)]
            book.count -= 1
            done += 1
            if record.levels is not None:  # expired: its estimate goes back
                for tier, marks in zip(record.levels, record.marks, strict=True):
                    self._give(tier, -record.estimate, record.since_ms, marks, now)
        if not book.count:
            del self.books[outer]

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
                self._put(plan, record)
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
        self._put(plan, _Record(now + plan.keep_ms, None, 0, now))
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

    def _put(self, plan: NestedPlan, record: _Record) -> None:
        """Record ``record`` under the plan's outer key and id, and keep the outer key's book
        as long as ``nested.lua``'s ``touch`` keeps R and Z: ``hold_ms`` at least, and past
        its latest due by a second."""
        outer, now = plan.key, plan.now_ms
        book = self.books.get(outer)
        if book is None:
            book = self.books[outer] = _Book([])
        if (outer, plan.rid) not in self.records:
            book.count += 1
        self.records[(outer, plan.rid)] = record
        heapq.heappush(book.due, (record.due_ms, plan.rid))
        book.top = max(book.top, record.due_ms)
        expires = now + max(plan.hold_ms, book.top - now + 1000)
        if book.expires_ms < expires:
            book.expires_ms = expires
            if not book.queued:
                book.queued = expires
                heapq.heappush(self._expiring, (expires, outer))
