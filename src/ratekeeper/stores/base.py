"""The store protocols: a store runs a ``Plan`` and returns one ``Outcome`` per rate.

A store knows nothing of rates or algorithms beyond "run this plan". ``Store`` is the sync
capability, ``AsyncStore`` the async one; a limiter checks the one it needs once, when built.
``Partitioned`` is optional: a store whose parts fail independently (the shards of
``ShardedRedisStore``) names each plan's part, and the limiter keeps one circuit breaker per
part, so a dead shard degrades only its own keys. ``KeyPartitioned`` says the same for calls
that carry a caller key but no plan (leases: the concurrency limiter's breakers). ``LocalStore``
is optional too: an in-process store (``MemoryStore``) that can take a one-rate hit without a
``Plan``, which the limiters use as their fast path. ``QueuingStore``: a batching store that
can queue a plan and answer through a future, so a caller waits by callback, not a coroutine.
``NestedStore``/``AsyncNestedStore``: a store that runs nested calls and reservation steps
(``NestedPlan``: several caller keys in one atomic call; every built-in store).
``SliceStore``: a store that answers some one-rate hits in process, from budget it took
ahead (``LocalBudget``'s slices), and sends the others the full way (``spend_one`` answers
None). ``FailLocalStore``: a store that can decide a plan without its backend when that
cannot be asked (fail-local), instead of the limiter failing open or closed.
``Pingable``/``AsyncPingable``: a store that can be checked at startup (every built-in store;
``Limiter.check`` uses it). ``AdminStore``/``AsyncAdminStore``: an admin's reset, credit or
debit with the state before and after, in one atomic step; ``ManyStore``/``AsyncManyStore``:
several plans in one round trip (``status``'s peeks). Every built-in store has all four.
Stores wrap their driver's errors in ``StoreUnavailable`` (``raise ... from exc``).
"""

from __future__ import annotations

import asyncio
from typing import Protocol, runtime_checkable

from ..algorithms import Algorithm, Limit, Outcome
from ..nested import NestedPlan, NestedReply
from ..plan import Plan


@runtime_checkable
class Store(Protocol):
    """Runs plans synchronously."""

    def execute(self, plan: Plan) -> tuple[Outcome, ...]:
        """Run one plan; ``refund``/``reset`` return an empty tuple."""
        ...


@runtime_checkable
class AsyncStore(Protocol):
    """Runs plans on an event loop."""

    async def execute_async(self, plan: Plan) -> tuple[Outcome, ...]:
        """Run one plan; ``refund``/``reset`` return an empty tuple."""
        ...


@runtime_checkable
class NestedStore(Protocol):
    """Runs nested calls and reservation steps synchronously, each in one atomic store call."""

    def execute_nested(self, plan: NestedPlan) -> NestedReply:
        """Run one nested plan (see ``nested.NestedReply`` for the answer's shape)."""
        ...


@runtime_checkable
class AsyncNestedStore(Protocol):
    """``NestedStore`` on an event loop."""

    async def execute_nested_async(self, plan: NestedPlan) -> NestedReply:
        """Run one nested plan (see ``nested.NestedReply``)."""
        ...


@runtime_checkable
class QueuingStore(Protocol):
    """An async store that can queue a plan in its next batch and answer through a future."""

    def execute_soon(self, plan: Plan) -> asyncio.Future[tuple[Outcome, ...]] | None:
        """``plan`` queued: a future of what ``execute_async`` would return (or raise); None
        when the store does not batch now (then await ``execute_async``)."""
        ...


@runtime_checkable
class Partitioned(Protocol):
    """A store made of parts that fail independently (checked once, when a limiter is built)."""

    def partition(self, plan: Plan) -> int:
        """The part (e.g. shard index) that runs ``plan``; stable for a given caller key."""
        ...


@runtime_checkable
class KeyPartitioned(Protocol):
    """A store whose parts fail independently, asked by caller key (lease calls have no plan)."""

    def partition_key(self, key: str) -> int:
        """The part that holds ``key``; the same part ``Partitioned.partition`` names for it."""
        ...


@runtime_checkable
class LocalStore(Protocol):
    """An in-process store that takes a one-rate hit directly (no ``Plan``, no I/O, no breaker).

    The limiters call ``hit_one`` instead of ``execute`` for cached one-rate hits, so a store
    (or a subclass) whose ``execute`` does more must do the same in ``hit_one``.
    """

    def hit_one(
        self, slot: str, key: str, algorithm: Algorithm, limit: Limit, now: int, cost: int
    ) -> Outcome:
        """The outcome ``execute`` would give for a ``hit`` plan of one rate."""
        ...


@runtime_checkable
class SliceStore(Protocol):
    """A store that answers a one-rate hit in process when it holds the budget for it."""

    def spend_one(
        self, slot: str, key: str, algorithm: Algorithm, limit: Limit, now: int, cost: int
    ) -> Outcome | None:
        """The outcome ``execute`` would give for a ``hit`` plan of one rate, when it needs no
        I/O; None when the plan must be executed."""
        ...


@runtime_checkable
class FailLocalStore(Protocol):
    """A store that decides in process when its backend cannot be asked."""

    def fail_local(self, plan: Plan) -> tuple[Outcome, ...] | None:
        """``plan``'s outcomes decided without the backend (the limiter marks the decision
        degraded; ``()`` for a refund or reset), or None: fail open or closed as configured."""
        ...


@runtime_checkable
class Pingable(Protocol):
    """A store that can say whether it answers."""

    def ping(self) -> None:
        """Return if the store answers; raise ``StoreUnavailable`` naming it (never a
        password) if not."""
        ...


@runtime_checkable
class AsyncPingable(Protocol):
    """``Pingable`` on an event loop."""

    async def ping_async(self) -> None:
        """See ``Pingable.ping``."""
        ...


Outcomes = tuple[Outcome, ...]


@runtime_checkable
class AdminStore(Protocol):
    """Applies an admin's change atomically and tells the state before and after."""

    def administer(self, plan: Plan) -> tuple[Outcomes, Outcomes]:
        """Run a ``reset``, ``credit`` or ``debit`` plan; the outcomes of a peek of nothing
        (cost 0) before and after it, read in the same atomic step."""
        ...


@runtime_checkable
class AsyncAdminStore(Protocol):
    """``AdminStore`` on an event loop."""

    async def administer_async(self, plan: Plan) -> tuple[Outcomes, Outcomes]:
        """See ``AdminStore.administer``."""
        ...


@runtime_checkable
class ManyStore(Protocol):
    """Runs several plans at once (one round trip where they share a server)."""

    def execute_many(self, plans: list[Plan]) -> list[Outcomes]:
        """Each plan's outcomes, in order."""
        ...


@runtime_checkable
class AsyncManyStore(Protocol):
    """``ManyStore`` on an event loop."""

    async def execute_many_async(self, plans: list[Plan]) -> list[Outcomes]:
        """See ``ManyStore.execute_many``."""
        ...
