"""Request coalescing: calls that are in flight together go to Redis as one batch.

``Batcher`` queues each call (a ``Plan``, or a lease call) and hands it back its own result. A
batch is sent when one of these comes first:

- ``max_size`` calls are queued (bounded size);
- fewer than ``max_in_flight`` batches are out (default 2): the store is asked at once (what
  arrived in the same event-loop turn goes along), so light load gets no added latency;
- a batch in flight comes back: what queued meanwhile goes at once (self-clocking);
- the oldest queued call has waited ``max_wait`` seconds (default 1 ms; bounded wait).

So under load, calls that arrive while Redis answers the batches out ride together in the
next one, sent when an answer comes back (or after ``max_wait`` if they are slow): one round
trip for many decisions, and no call waits for a timer while Redis is idle. Two batches out
at once let the process work on one batch's answers and the next requests while Redis runs
the other, instead of each waiting for the other in turn. Each call gets its own
result or its own exception; one failing call fails no other.

The Redis stores own their batchers (``Batching`` is their setting; ``None`` turns it off): a
``RedisStore`` batches on its asyncio client (``pipeline.RedisPipeline``), so a
``ShardedRedisStore`` batches per primary and per replica, and a ``RedisClusterStore`` per
cluster primary (``cluster_batching``). ``AsyncLimiter``, ``AsyncConcurrencyLimiter``, the ASGI
middleware and the service all reach Redis through them. Sync calls are never batched.

A batcher serves one event loop at a time: the stores keep one per loop (``loops.PerLoop``,
with the pipeline and client under it). Used from a new loop after the last one stopped (a new
``asyncio.run``), a batcher starts afresh there; used from a second loop while the first is
still running (two threads), it refuses (``RuntimeError``) rather than drop the first loop's
calls.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Generic, Protocol, TypeVar

from ...errors import ConfigError

T = TypeVar("T")
R = TypeVar("R")


class BatchObserver(Protocol):
    """Told about every batch and every failed call (the service feeds its metrics from it)."""

    def batch(self, size: int, seconds: float) -> None:
        """One batch of ``size`` calls took ``seconds`` (the round trip, parsing included)."""
        ...

    def error(self) -> None:
        """One call of a batch failed."""
        ...


@dataclass(frozen=True, slots=True)
class Batching:
    """How a Redis store coalesces concurrent async calls (``batching=None``: one call each)."""

    max_size: int = 128
    """Most calls in one batch."""
    max_wait: float = 0.001
    """Longest a call waits in the queue behind the batches in flight, in seconds (0 to 0.1)."""
    observer: BatchObserver | None = None
    max_in_flight: int = 2
    """Batches out at once before calls queue behind them (1 to 64)."""

    def __post_init__(self) -> None:
        size, wait, out = self.max_size, self.max_wait, self.max_in_flight
        if isinstance(size, bool) or not isinstance(size, int) or size < 1:
            raise ConfigError(f"batch max_size={size!r} is invalid; expected a whole number >= 1")
        if isinstance(out, bool) or not isinstance(out, int) or not 1 <= out <= 64:
            raise ConfigError(f"batch max_in_flight={out!r} is invalid; expected 1 to 64")
        if isinstance(wait, bool) or not isinstance(wait, int | float) or not 0 <= wait <= 0.1:
            raise ConfigError(f"batch max_wait={wait!r} s is invalid; expected 0 to 0.1")


DEFAULT_BATCHING = Batching()
"""The Redis stores' default: up to 128 calls per batch, at most 1 ms of waiting, two batches
out at once."""

ExecuteMany = Callable[[Sequence[T]], Awaitable[list[R | BaseException]]]


class Batcher(Generic[T, R]):
    """Coalesces concurrent calls into batches for ``execute_many`` (see the module docstring)."""

    def __init__(self, execute_many: ExecuteMany[T, R], settings: Batching | None = None) -> None:
        self.execute_many = execute_many
        self.settings = settings or Batching()
        self.max_size = self.settings.max_size
        self.max_wait = self.settings.max_wait
        self.max_in_flight = self.settings.max_in_flight
        self.observer = self.settings.observer
        self._loop: asyncio.AbstractEventLoop | None = None
        self._start(None)
        self.batches = 0
        self.calls = 0

    def _start(self, loop: asyncio.AbstractEventLoop | None) -> None:
        """A fresh queue on ``loop`` (a batcher never carries work from one loop to another)."""
        self._loop = loop
        self._queue: list[tuple[T, asyncio.Future[R]]] = []
        self._in_flight = 0
        self._timer: asyncio.TimerHandle | None = None
        self._soon = False
        self._tasks: set[asyncio.Future[None]] = set()

    async def submit(self, call: T) -> R:
        """Queue ``call`` and wait for its own result (or its own exception)."""
        return await self.enqueue(call)

    def enqueue(self, call: T) -> asyncio.Future[R]:
        """Queue ``call``; the future gets its own result (or its own exception). For callers
        that wait by callback (``add_done_callback``) instead of a coroutine."""
        loop = asyncio.get_running_loop()
        if loop is not self._loop:
            self._move(loop)
        future: asyncio.Future[R] = loop.create_future()
        self._queue.append((call, future))
        self._schedule(loop)
        return future

    def _move(self, loop: asyncio.AbstractEventLoop) -> None:
        """Start afresh on ``loop``, unless the loop served so far still runs with calls of its
        own queued or in flight (another thread's): those would be lost."""
        old = self._loop
        if old is not None and old.is_running() and (self._queue or self._in_flight):
            raise RuntimeError(
                "this Batcher serves another running event loop; keep one per loop (the Redis "
                "stores do)"
            )
        self._start(loop)

    def _schedule(self, loop: asyncio.AbstractEventLoop) -> None:
        if len(self._queue) >= self.max_size:
            self._flush()
        elif self._in_flight < self.max_in_flight:
            if not self._soon:  # send after this loop turn: what arrived together goes together
                self._soon = True
                loop.call_soon(self._flush)
        elif self._timer is None:
            self._timer = loop.call_later(self.max_wait, self._flush)

    def _flush(self) -> None:
        self._soon = False
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        loop = self._loop
        assert loop is not None  # set by the call that queued
        while self._queue:
            batch = self._queue[: self.max_size]
            del self._queue[: self.max_size]
            self._in_flight += 1
            task = loop.create_task(self._send(batch))
            self._tasks.add(task)  # keep a reference until it is done
            task.add_done_callback(self._tasks.discard)
            if len(self._queue) < self.max_size:
                break
        if self._queue:
            self._schedule(loop)

    async def _send(self, batch: list[tuple[T, asyncio.Future[R]]]) -> None:
        self.batches += 1
        self.calls += len(batch)
        start = time.perf_counter()
        loop = batch[0][1].get_loop()
        replies: list[R | BaseException]
        try:
            replies = await self.execute_many([call for call, _ in batch])
        except Exception as exc:  # handed to every waiter of the batch, never lost
            replies = [exc] * len(batch)
        except BaseException:  # cancelled: no waiter may hang
            if not loop.is_closed():
                for _, future in batch:
                    future.cancel()
            raise
        finally:
            if loop is self._loop:  # not a batch of a loop the batcher has left
                self._in_flight -= 1
            if self.observer is not None:
                self.observer.batch(len(batch), time.perf_counter() - start)
            if self._queue and not loop.is_closed():  # what queued meanwhile goes now
                self._flush()
        if loop.is_closed():  # abandoned with its loop (collected later): nobody waits
            return
        for (_, future), reply in zip(batch, replies, strict=True):
            if future.done():  # the caller went away (cancelled)
                continue
            if isinstance(reply, BaseException):
                if self.observer is not None:
                    self.observer.error()
                future.set_exception(reply)
            else:
                future.set_result(reply)
