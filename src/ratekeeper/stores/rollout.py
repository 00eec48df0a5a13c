"""``RolloutStore``: move limits from one store to another a share of keys at a time.

GitHub moved its limiter to a new backend behind a flag that sent a growing percentage of
clients to it, changeable without a deploy. ``RolloutStore(old, new)`` does that for any two
stores (one Redis to a sharded store or a Cluster, a default key layout to the compact one):

- **A stable share**: a caller key goes to ``new`` when its position (a hash of the key, in
  0..9999) is below ``share`` x 100, else to ``old``. Raising the share only adds keys to
  ``new``; lowering it sends them back. Every rate of a call follows its key, so a stack
  stays on one store.
- **Changeable at runtime**: ``set(share=, mode=)``, or a flag ``source`` polled every
  ``refresh_every`` seconds (monotonic clock): a ``Controls`` source such as
  ``redis_flags(client, "ratekeeper:rollout")`` reading ``share`` (percent) and ``mode``.
  An unreadable source or a bad value keeps the last good settings (logged).
- **Compare mode** (GitHub's Scientist pattern): ``mode="compare"`` sends the share to both
  stores; ``old`` answers, ``new`` is measured: calls compared, disagreements (a rate allowed
  by one store and rejected by the other) and other differences counted in ``stats()`` and
  logged at most once per ``log_interval``; ``new``'s failures are counted, never seen by
  the caller. ``new``'s state warms up meanwhile.

What a key experiences when it moves: its state stays where it was, so on the other store its
count starts over (a full quota: up to one extra limit's worth in that window), unless compare
mode ran long enough (one window) to build the same state there. ``reset`` goes to both stores,
so a key moved back never finds an old count. Leases follow the share too; a release goes to
the store that owns the key now and then, if that found nothing, to the other.

Nested calls and reservations follow their outermost key (every level with it), compared
like plans in compare mode.

A ``RolloutStore`` is ``Partitioned``: the limiter keeps breakers for ``old``'s parts and
``new``'s apart, so a failing new store fails open only the keys sent to it.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import math
import time
from collections.abc import Callable, Mapping
from functools import lru_cache
from typing import Any, Protocol, runtime_checkable

from ..algorithms import Outcome
from ..errors import ConfigError
from ..nested import NestedPlan, NestedReply
from ..plan import Plan
from .base import (
    AsyncNestedStore,
    AsyncPingable,
    AsyncStore,
    KeyPartitioned,
    NestedStore,
    Partitioned,
    Pingable,
    Store,
)
from .leases import AsyncLeaseStore, LeaseStore

log = logging.getLogger("ratekeeper")

MODES = ("switch", "compare")
NEW_PARTS = 1 << 20
"""``new``'s partitions are numbered from here (``old``'s from 0)."""

Source = Callable[[], Mapping[str, str]]


@lru_cache(maxsize=65536)
def position(key: str) -> int:
    """A caller key's place in the rollout, 0..9999 (stable across processes and releases)."""
    digest = hashlib.blake2b(key.encode("utf-8", "surrogatepass"), digest_size=8).digest()
    return int.from_bytes(digest, "big") % 10_000


def check_share(share: object) -> float:
    """A share is a percentage from 0 to 100."""
    if isinstance(share, bool) or not isinstance(share, int | float) or not 0 <= share <= 100:
        raise ConfigError(f"rollout share={share!r} is invalid; expected a percentage, 0 to 100")
    return float(share)


def check_mode(mode: object) -> str:
    """A mode is ``switch`` (the share is answered by ``new``) or ``compare``."""
    if mode not in MODES:
        raise ConfigError(f"rollout mode={mode!r} is invalid; expected one of {', '.join(MODES)}")
    return str(mode)


class RolloutStore:
    """Sends a stable share of caller keys to ``new`` and the rest to ``old`` (see the module)."""

    def __init__(
        self,
        old: Any,
        new: Any,
        *,
        share: float = 0.0,
        mode: str = "switch",
        source: Source | None = None,
        refresh_every: float = 5.0,
        log_interval: float = 10.0,
        monotonic: Callable[[], float] = time.monotonic,
    ) -> None:
        self.old = old
        self.new = new
        both = (old, new)
        # capabilities, checked once: what both stores can do
        self._can = {
            "sync": all(isinstance(s, Store) for s in both),
            "async": all(isinstance(s, AsyncStore) for s in both),
            "leases": all(isinstance(s, LeaseStore) for s in both),
            "async leases": all(isinstance(s, AsyncLeaseStore) for s in both),
            "nested": all(isinstance(s, NestedStore) for s in both),
            "async nested": all(isinstance(s, AsyncNestedStore) for s in both),
        }
        if not any(self._can.values()):
            raise ConfigError(
                f"stores {old!r} and {new!r} have no way of running calls in common; expected "
                "two stores that both run plans (Store or AsyncStore) or hold leases"
            )
        self.share = check_share(share)
        self.mode = check_mode(mode)
        if refresh_every <= 0 or not math.isfinite(refresh_every):
            raise ConfigError(f"refresh_every={refresh_every!r} is invalid; expected seconds > 0")
        self._source = source
        self._refresh_every = refresh_every
        self._next_refresh = -math.inf
        self._log_interval = log_interval
        self._last_log = -math.inf
        self._monotonic = monotonic
        self._unlogged = 0
        self.counts = dict.fromkeys(
            ("to_old", "to_new", "compared", "disagreed", "differed", "new_errors", "flag_errors"),
            0,
        )

    def __repr__(self) -> str:
        return f"RolloutStore({self.old!r} -> {self.new!r}, share={self.share}, mode={self.mode})"

    # ------------------------------------------------------------------ settings

    def set(self, *, share: float | None = None, mode: str | None = None) -> None:
        """Change the share (percent) or the mode now (a flag source may change them again)."""
        if share is not None:
            self.share = check_share(share)
        if mode is not None:
            self.mode = check_mode(mode)

    def _refresh(self) -> None:
        """Read the flag source when it is due; keep the last good settings on any failure."""
        now = self._monotonic()
        if now < self._next_refresh or self._source is None:
            return
        self._next_refresh = now + self._refresh_every
        try:
            flags = self._source()
            share = flags.get("share")
            mode = flags.get("mode")
            self.set(
                share=None if share is None else float(share),
                mode=None if mode is None else str(mode),
            )
        except Exception as exc:
            self.counts["flag_errors"] += 1
            self._warn(now, "rollout flags unreadable, keeping share %s%% mode %s: %s",
                       self.share, self.mode, exc)  # fmt: skip

    def moved(self, key: str) -> bool:
        """Whether ``key`` is in the share (answered by ``new``, or compared on it)."""
        return position(key) < self.share * 100

    def stats(self) -> dict[str, Any]:
        """Share, mode, calls per store, compare counts, ``new``'s and the flags' failures."""
        return {"share": self.share, "mode": self.mode, **self.counts}

    # ------------------------------------------------------------------ routing

    def _route(self, key: str) -> tuple[Any, bool]:
        """(the store that answers ``key``, whether ``new`` is also to be measured)."""
        if self._source is not None:
            self._refresh()
        if not self.moved(key):
            self.counts["to_old"] += 1
            return self.old, False
        if self.mode == "compare":
            self.counts["to_old"] += 1
            return self.old, True
        self.counts["to_new"] += 1
        return self.new, False

    def partition(self, plan: Plan) -> int:
        """``old``'s part of ``plan`` (0..), or ``NEW_PARTS`` + ``new``'s (``Partitioned``)."""
        if self.moved(plan.key) and self.mode == "switch":
            return NEW_PARTS + (
                self.new.partition(plan) if isinstance(self.new, Partitioned) else 0
            )
        return self.old.partition(plan) if isinstance(self.old, Partitioned) else 0

    def partition_key(self, key: str) -> int:
        """The same for a caller key (``KeyPartitioned``: lease calls)."""
        if self.moved(key) and self.mode == "switch":
            new = self.new
            return NEW_PARTS + (new.partition_key(key) if isinstance(new, KeyPartitioned) else 0)
        return self.old.partition_key(key) if isinstance(self.old, KeyPartitioned) else 0

    # ------------------------------------------------------------------ plans

    def execute(self, plan: Plan) -> tuple[Outcome, ...]:
        """Run ``plan`` on the store that answers its key; in compare mode on ``new`` too."""
        if plan.op == "reset":
            return self._reset(plan)
        store, compare = self._route(plan.key)
        self._need("sync")
        answer: tuple[Outcome, ...] = store.execute(plan)
        if compare:
            try:
                measured = self.new.execute(plan)
            except Exception as exc:
                self._new_failed(exc)
            else:
                self._compare(plan, answer, measured)
        return answer

    async def execute_async(self, plan: Plan) -> tuple[Outcome, ...]:
        """The same as ``execute`` on the stores' async paths; in compare mode both stores are
        asked at once (the caller waits for the slower)."""
        if plan.op == "reset":
            return await self._reset_async(plan)
        store, compare = self._route(plan.key)
        self._need("async")
        if not compare:
            result: tuple[Outcome, ...] = await store.execute_async(plan)
            return result
        old: AsyncStore = self.old
        new: AsyncStore = self.new
        answer, measured = await asyncio.gather(
            old.execute_async(plan), new.execute_async(plan), return_exceptions=True
        )
        if isinstance(answer, BaseException):
            raise answer
        if isinstance(measured, BaseException):
            self._new_failed(measured)
        else:
            self._compare(plan, answer, measured)
        return answer

    def execute_nested(self, plan: NestedPlan) -> NestedReply:
        """Run a nested plan on the store that answers its outermost key; in compare mode on
        ``new`` too (``NestedStore``)."""
        store, compare = self._route(plan.key)
        self._need("nested")
        answer: NestedReply = store.execute_nested(plan)
        if compare:
            try:
                measured = self.new.execute_nested(plan)
            except Exception as exc:
                self._new_failed(exc)
            else:
                self._compare_nested(plan, answer, measured)
        return answer

    async def execute_nested_async(self, plan: NestedPlan) -> NestedReply:
        """The same as ``execute_nested`` on the async paths (both stores at once)."""
        store, compare = self._route(plan.key)
        self._need("async nested")
        if not compare:
            result: NestedReply = await store.execute_nested_async(plan)
            return result
        old: AsyncNestedStore = self.old
        new: AsyncNestedStore = self.new
        answer, measured = await asyncio.gather(
            old.execute_nested_async(plan), new.execute_nested_async(plan), return_exceptions=True
        )
        if isinstance(answer, BaseException):
            raise answer
        if isinstance(measured, BaseException):
            self._new_failed(measured)
        else:
            self._compare_nested(plan, answer, measured)
        return answer

    def _compare_nested(self, plan: NestedPlan, answer: NestedReply, measured: Any) -> None:
        self.counts["compared"] += 1
        if answer == measured:
            return
        self.counts["disagreed" if answer[0] != measured[0] else "differed"] += 1
        self._unlogged += 1
        self._warn(
            self._monotonic(),
            "rollout compare: %d differences since the last report (%d compared, %d "
            "disagreed in all); latest: nested %s, old %s, new %s",
            self._unlogged, self.counts["compared"], self.counts["disagreed"], plan.op,
            answer[0], measured[0],
        )  # fmt: skip

    def administer(self, plan: Plan) -> tuple[tuple[Outcome, ...], tuple[Outcome, ...]]:
        """An admin's change on the store that answers the key (a reset on both, as
        ``reset``); the answer is that store's (``AdminStore``)."""
        store, compare = self._route(plan.key)
        self._need("sync")
        other = self.new if store is self.old else self.old
        if plan.op == "reset" or compare:
            try:
                other.administer(plan)
            except Exception as exc:
                self._new_failed(exc)
        result: tuple[tuple[Outcome, ...], tuple[Outcome, ...]] = store.administer(plan)
        return result

    async def administer_async(self, plan: Plan) -> tuple[tuple[Outcome, ...], tuple[Outcome, ...]]:
        """The same as ``administer`` on the stores' async paths."""
        store, compare = self._route(plan.key)
        self._need("async")
        other = self.new if store is self.old else self.old
        if plan.op == "reset" or compare:
            try:
                await other.administer_async(plan)
            except Exception as exc:
                self._new_failed(exc)
        result: tuple[tuple[Outcome, ...], tuple[Outcome, ...]] = await store.administer_async(plan)
        return result

    def execute_many(self, plans: list[Plan]) -> list[tuple[Outcome, ...]]:
        """Several plans, each on the store that answers its key (``ManyStore``)."""
        return [self.execute(plan) for plan in plans]

    async def execute_many_async(self, plans: list[Plan]) -> list[tuple[Outcome, ...]]:
        """The same as ``execute_many``, asked at once."""
        return list(await asyncio.gather(*(self.execute_async(plan) for plan in plans)))

    def _reset(self, plan: Plan) -> tuple[Outcome, ...]:
        """A reset goes to both stores: a key moved back must not find its old count."""
        store, _ = self._route(plan.key)
        self._need("sync")
        other = self.new if store is self.old else self.old
        try:
            other.execute(plan)
        except Exception as exc:
            self._new_failed(exc)
        result: tuple[Outcome, ...] = store.execute(plan)
        return result

    async def _reset_async(self, plan: Plan) -> tuple[Outcome, ...]:
        store, _ = self._route(plan.key)
        self._need("async")
        other = self.new if store is self.old else self.old
        try:
            await other.execute_async(plan)
        except Exception as exc:
            self._new_failed(exc)
        result: tuple[Outcome, ...] = await store.execute_async(plan)
        return result

    def _compare(
        self, plan: Plan, answer: tuple[Outcome, ...], measured: tuple[Outcome, ...]
    ) -> None:
        self.counts["compared"] += 1
        if answer == measured:
            return
        disagreed = [a[0] for a in answer] != [m[0] for m in measured]
        self.counts["disagreed" if disagreed else "differed"] += 1
        self._unlogged += 1
        self._warn(
            self._monotonic(),
            "rollout compare: %d differences since the last report (%d compared, %d "
            "disagreed in all); latest: %s %s, old %s, new %s",
            self._unlogged, self.counts["compared"], self.counts["disagreed"], plan.op,
            plan.policy.algorithm.NAME, list(map(tuple, answer)), list(map(tuple, measured)),
        )  # fmt: skip

    def _new_failed(self, exc: BaseException) -> None:
        self.counts["new_errors"] += 1
        self._warn(self._monotonic(), "rollout: the other store failed (ignored): %s", exc)

    def _warn(self, now: float, message: str, *args: object) -> None:
        if now - self._last_log >= self._log_interval:
            self._last_log = now
            self._unlogged = 0
            log.warning(message, *args)

    # ------------------------------------------------------------------ leases

    def _lease_store(self, key: str, kind: str) -> tuple[Any, Any]:
        """(the store that holds ``key``'s leases now, the other one)."""
        self._need(kind)
        if self._source is not None:
            self._refresh()
        if self.moved(key) and self.mode == "switch":
            return self.new, self.old
        return self.old, self.new

    def acquire_lease(
        self, key: str, lease_id: str, capacity: int, now_ms: int, expires_ms: int
    ) -> tuple[bool, int]:
        """Sweep, count and add one lease on the store that holds ``key`` (``LeaseStore``)."""
        owner, _ = self._lease_store(key, "leases")
        result: tuple[bool, int] = owner.acquire_lease(key, lease_id, capacity, now_ms, expires_ms)
        return result

    def release_lease(self, key: str, lease_id: str, now_ms: int) -> bool:
        """Remove one lease where it is: the owner now, else the other store (``LeaseStore``)."""
        owner, other = self._lease_store(key, "leases")
        if owner.release_lease(key, lease_id, now_ms):
            return True
        return bool(other.release_lease(key, lease_id, now_ms))

    def count_leases(self, key: str, now_ms: int) -> int:
        """Live leases of ``key`` on the store that holds it (``LeaseStore``)."""
        owner, _ = self._lease_store(key, "leases")
        return int(owner.count_leases(key, now_ms))

    async def acquire_lease_async(
        self, key: str, lease_id: str, capacity: int, now_ms: int, expires_ms: int
    ) -> tuple[bool, int]:
        """The same as ``acquire_lease``, on the async paths."""
        owner, _ = self._lease_store(key, "async leases")
        result: tuple[bool, int] = await owner.acquire_lease_async(
            key, lease_id, capacity, now_ms, expires_ms
        )
        return result

    async def release_lease_async(self, key: str, lease_id: str, now_ms: int) -> bool:
        """The same as ``release_lease``, on the async paths."""
        owner, other = self._lease_store(key, "async leases")
        if await owner.release_lease_async(key, lease_id, now_ms):
            return True
        return bool(await other.release_lease_async(key, lease_id, now_ms))

    async def count_leases_async(self, key: str, now_ms: int) -> int:
        """The same as ``count_leases``, on the async paths."""
        owner, _ = self._lease_store(key, "async leases")
        return int(await owner.count_leases_async(key, now_ms))

    # ------------------------------------------------------------------ lifetime

    def ping(self) -> None:
        """Check both stores answer (``Pingable``); ``StoreUnavailable`` naming the one that
        does not."""
        for store in (self.old, self.new):
            if isinstance(store, Pingable):
                store.ping()

    async def ping_async(self) -> None:
        """``ping`` on the async paths."""
        for store in (self.old, self.new):
            if isinstance(store, AsyncPingable):
                await store.ping_async()

    def close(self) -> None:
        """Close both stores' sync connections."""
        for store in (self.old, self.new):
            if isinstance(store, _Closes):
                store.close()

    async def aclose(self) -> None:
        """Close both stores' async connections."""
        for store in (self.old, self.new):
            if isinstance(store, _AsyncCloses):
                await store.aclose()

    def _need(self, kind: str) -> None:
        if not self._can[kind]:
            raise ConfigError(f"the stores of this rollout cannot both run {kind} calls")


@runtime_checkable
class _Closes(Protocol):
    def close(self) -> None: ...


@runtime_checkable
class _AsyncCloses(Protocol):
    async def aclose(self) -> None: ...
