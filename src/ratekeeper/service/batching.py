"""Request coalescing: plans that arrive together go to the store as one batch.

``Batcher`` is an ``AsyncStore``. Each ``execute_async`` queues its plan and waits for its own
result. A batch is sent when one of these comes first:

- ``max_size`` plans are queued (bounded size);
- no batch is in flight (an idle store is asked at once: no added latency under light load);
- a batch has been waiting ``max_wait`` seconds (default 1 ms) while ``max_in_flight``
  batches are already out (bounded wait).

So under load, requests that arrive while Redis answers the previous batch ride together in
the next one: one round trip and one pipeline for many decisions. Each plan gets its own
result or its own exception; one failing plan fails no other.

``RedisPipeline`` runs a batch on one Redis as a pipeline (no MULTI: each script is atomic on
its own, and a batch needs no more) using the Redis codec, so batched decisions are the same
as ``RedisStore``'s; a ``NOSCRIPT`` reply is retried with ``EVAL`` for that plan only.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, Sequence

import redis.asyncio
from redis.exceptions import NoScriptError, RedisError

from ..algorithms import Outcome
from ..errors import ConfigError, StoreUnavailable
from ..plan import Plan
from ..stores.redis_codec import Codec, fallback, outcomes
from .metrics import Metrics

Reply = tuple[Outcome, ...] | BaseException
ExecuteMany = Callable[[Sequence[Plan]], Awaitable[list[Reply]]]


class Batcher:
    """Coalesces concurrent plans into batches for ``execute_many``."""

    def __init__(
        self,
        execute_many: ExecuteMany,
        metrics: Metrics | None = None,
        max_size: int = 128,
        max_wait: float = 0.001,
        max_in_flight: int = 2,
    ) -> None:
        if isinstance(max_size, bool) or not isinstance(max_size, int) or max_size < 1:
            raise ConfigError(f"batch max_size={max_size!r} is invalid; expected >= 1")
        if not 0 <= max_wait <= 0.1:
            raise ConfigError(f"batch max_wait={max_wait!r} s is invalid; expected 0 to 0.1")
        if max_in_flight < 1:
            raise ConfigError(f"batch max_in_flight={max_in_flight!r} is invalid; expected >= 1")
        self.execute_many = execute_many
        self.metrics = metrics
        self.max_size = max_size
        self.max_wait = max_wait
        self.max_in_flight = max_in_flight
        self._queue: list[tuple[Plan, asyncio.Future[tuple[Outcome, ...]]]] = []
        self._in_flight = 0
        self._timer: asyncio.TimerHandle | None = None
        self._soon = False
        self._tasks: set[asyncio.Future[None]] = set()
        self.batches = 0
        self.plans = 0

    async def execute_async(self, plan: Plan) -> tuple[Outcome, ...]:
        loop = asyncio.get_running_loop()
        future: asyncio.Future[tuple[Outcome, ...]] = loop.create_future()
        self._queue.append((plan, future))
        self._schedule(loop)
        return await future

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
        while self._queue:
            batch = self._queue[: self.max_size]
            del self._queue[: self.max_size]
            self._in_flight += 1
            task = asyncio.ensure_future(self._send(batch))
            self._tasks.add(task)  # keep a reference until it is done
            task.add_done_callback(self._tasks.discard)
            if len(self._queue) < self.max_size:
                break
        if self._queue:
            self._schedule(asyncio.get_running_loop())

    async def _send(self, batch: list[tuple[Plan, asyncio.Future[tuple[Outcome, ...]]]]) -> None:
        self.batches += 1
        self.plans += len(batch)
        start = time.perf_counter()
        try:
            replies = await self.execute_many([plan for plan, _ in batch])
        except Exception as exc:  # handed to every waiter of the batch, never lost
            replies = [exc] * len(batch)
        except BaseException:  # cancelled: no waiter may hang
            for _, future in batch:
                future.cancel()
            raise
        finally:
            self._in_flight -= 1
            if self.metrics is not None:
                self.metrics.batch_size.observe(len(batch))
                self.metrics.store_latency.observe(time.perf_counter() - start)
        for (_, future), reply in zip(batch, replies, strict=True):
            if future.done():  # the caller went away (cancelled)
                continue
            if isinstance(reply, BaseException):
                if self.metrics is not None:
                    self.metrics.store_errors.inc()
                future.set_exception(reply)
            else:
                future.set_result(reply)
        if self._queue and self._in_flight < self.max_in_flight and not self._soon:
            self._soon = True
            asyncio.get_running_loop().call_soon(self._flush)


class RedisPipeline:
    """``execute_many`` for one Redis: a batch of plans is one pipeline round trip."""

    def __init__(self, client: redis.asyncio.Redis, prefix: str = "rk") -> None:
        self.client = client
        self.codec = Codec(prefix)
        self.round_trips = 0

    async def __call__(self, plans: Sequence[Plan]) -> list[Reply]:
        codec = self.codec
        pipe = self.client.pipeline(transaction=False)
        commands = []
        for plan in plans:
            if plan.op == "reset":
                command: tuple[object, ...] = ("DEL", *codec.keys(plan))
            else:
                command = codec.command(plan)
            commands.append(command)
            pipe.execute_command(*command)
        try:
            self.round_trips += 1
            raw = await pipe.execute(raise_on_error=False)
        except (RedisError, OSError) as exc:
            error = StoreUnavailable(f"redis pipeline failed: {type(exc).__name__}: {exc}")
            return [error] * len(plans)
        out: list[Reply] = []
        for plan, command, reply in zip(plans, commands, raw, strict=True):
            if isinstance(reply, NoScriptError):
                try:
                    self.round_trips += 1
                    reply = await self.client.execute_command(*fallback(command))  # type: ignore[no-untyped-call]  # untyped in redis-py
                except (RedisError, OSError) as exc:
                    reply = exc
            if isinstance(reply, BaseException):
                out.append(
                    StoreUnavailable(
                        f"redis could not run {plan.op}: {type(reply).__name__}: {reply}"
                    )
                )
            elif plan.op == "reset":
                out.append(())
            else:
                out.append(outcomes(reply))
        return out
