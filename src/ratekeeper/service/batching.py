"""Request coalescing: plans that arrive together go to the store as one batch.

``Batcher`` is an ``AsyncStore``. Each ``execute_async`` queues its plan and waits for its own
result. A batch is sent when one of these comes first:

- ``max_size`` plans are queued (bounded size);
- no batch is in flight: an idle store is asked at once (what arrived in the same event-loop
  turn goes along), so light load gets no added latency;
- a batch in flight comes back: what queued meanwhile goes at once (self-clocking);
- the oldest queued plan has waited ``max_wait`` seconds (default 1 ms; bounded wait).

So under load, requests that arrive while Redis answers the previous batch ride together in
the next one, sent when that answer comes back (or after ``max_wait`` if it is slow): one
round trip for many decisions, and no plan waits for a timer while Redis is idle. Each
plan gets its own result or its own exception; one failing plan fails no other.

``ShardedBatcher`` does the same per shard of a ``ShardedRedisStore``: writes (hit, refund,
reset) are batched to the owning shard's primary; peeks keep the store's replica routing.

``RedisPipeline`` runs a batch on one Redis as one pipelined write and its replies (no MULTI:
each script is atomic on its own, and a batch needs no more) using the Redis codec, so batched
decisions are the same as ``RedisStore``'s. After ``NOSCRIPT`` replies (a restarted or
flushed Redis) each missing script is loaded once and the plans that missed it are re-sent as
one batch; a plan that misses it again falls back to ``EVAL`` on its own. It encodes
requests and parses replies itself (``Codec.packed``, a ``hiredis.Reader`` on the
connection's stream): per decision, redis-py's command machinery costs more than everything
else the batch does.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, Sequence

import hiredis
import redis.asyncio
from redis.exceptions import AskError, RedisError, ResponseError
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError

from ..algorithms import Outcome
from ..errors import ConfigError, NotSent, StoreUnavailable
from ..plan import Plan
from ..stores.redis import client_options
from ..stores.redis_codec import Codec, fallback, outcomes, pack
from ..stores.sharded import ShardedRedisStore
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
    ) -> None:
        check_batch(max_size, max_wait)
        self.execute_many = execute_many
        self.metrics = metrics
        self.max_size = max_size
        self.max_wait = max_wait
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
        elif not self._in_flight:
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
            if self._queue:  # what queued during this round trip goes now, not at the timer
                self._flush()
        for (_, future), reply in zip(batch, replies, strict=True):
            if future.done():  # the caller went away (cancelled)
                continue
            if isinstance(reply, BaseException):
                if self.metrics is not None:
                    self.metrics.store_errors.inc()
                future.set_exception(reply)
            else:
                future.set_result(reply)


def check_batch(max_size: int, max_wait: float) -> None:
    """Refuse batch settings out of range, naming the value."""
    if isinstance(max_size, bool) or not isinstance(max_size, int) or max_size < 1:
        raise ConfigError(f"batch max_size={max_size!r} is invalid; expected >= 1")
    if not 0 <= max_wait <= 0.1:
        raise ConfigError(f"batch max_wait={max_wait!r} s is invalid; expected 0 to 0.1")


class ShardedBatcher:
    """Batches each shard's writes on its primary; a ``Partitioned`` store (breaker per shard)."""

    def __init__(
        self,
        store: ShardedRedisStore,
        socket_timeout: float,
        metrics: Metrics | None = None,
        max_size: int = 128,
        max_wait: float = 0.001,
    ) -> None:
        self.store = store
        options = client_options(socket_timeout)
        self.batchers = [
            Batcher(
                RedisPipeline(redis.asyncio.Redis.from_url(shard.url, **options), store.prefix),
                metrics,
                max_size,
                max_wait,
            )
            for shard in store.shards
        ]

    def partition(self, plan: Plan) -> int:
        """The shard that owns ``plan``'s key (one circuit breaker per shard)."""
        return self.store.partition(plan)

    async def execute_async(self, plan: Plan) -> tuple[Outcome, ...]:
        if plan.op == "peek":
            return await self.store.execute_async(plan)
        return await self.batchers[self.store.partition(plan)].execute_async(plan)


class RedisPipeline:
    """``execute_many`` for one Redis: a batch of plans is one pipelined round trip.

    The commands are encoded by the codec (``Codec.packed``: per-policy pieces encoded once)
    into one buffer, written on one pooled connection, and the replies are parsed by a
    ``hiredis.Reader`` fed straight from the connection's stream, under one timeout for the
    whole batch. redis-py's ``Pipeline``, and even its per-reply ``read_response`` (a timeout
    context each), cost more per command than the rest of a decision.
    """

    def __init__(self, client: redis.asyncio.Redis, prefix: str = "rk") -> None:
        self.client = client
        self.codec = Codec(prefix)
        self.round_trips = 0

    async def __call__(self, plans: Sequence[Plan]) -> list[Reply]:
        codec = self.codec
        packed: list[bytes] = []
        for plan in plans:
            if plan.op == "reset":
                packed.append(pack(("DEL", *codec.keys(plan))))
            else:
                packed.append(codec.packed(plan))
        replies = await self._send(b"".join(packed), len(packed))
        missing = [i for i, reply in enumerate(replies) if _noscript(reply)]
        if missing:  # a restarted or flushed Redis: load each script once, send those again
            replies = await self._reload_and_resend(plans, packed, replies, missing)
        out: list[Reply] = []
        for plan, reply in zip(plans, replies, strict=True):
            if type(reply) is list:  # the common case: a script's array of integers
                out.append(outcomes(reply))
            else:
                out.append(await self._answer(plan, reply))
        return out

    async def _reload_and_resend(
        self, plans: Sequence[Plan], packed: list[bytes], replies: list[object], missing: list[int]
    ) -> list[object]:
        """``SCRIPT LOAD`` each script the batch missed, then re-send the missed plans as one
        batch: a burst after a restart costs a few round trips, not one ``EVAL`` per plan. A
        plan still missing its script afterwards falls back to ``EVAL`` in ``_answer``."""
        sources = {fallback(self.codec.command(plans[i]))[1] for i in missing}
        try:
            for source in sources:
                self.round_trips += 1
                await self.client.script_load(source)
        except (RedisError, OSError):
            return replies  # each missed plan tries EVAL on its own
        again = await self._send(b"".join(packed[i] for i in missing), len(missing))
        out = list(replies)
        for i, reply in zip(missing, again, strict=True):
            out[i] = reply
        return out

    async def _send(self, data: bytes, count: int) -> list[object]:
        """Write the batch on one pooled connection and read its ``count`` replies in order.

        A connection that drops before any reply is read (one pooled before a Redis restart)
        is retried once at once on a fresh connection, as ``RedisStore`` does; a timeout or
        a drop after replies began is never retried (the scripts may have run).
        """
        try:
            return await self._send_once(data, count)
        except _Dropped:
            pass
        try:
            return await self._send_once(data, count)
        except _Dropped as dropped:
            return [_not_sent(dropped.error)] * count

    async def _send_once(self, data: bytes, count: int) -> list[object]:
        pool = self.client.connection_pool
        replies: list[object] = []
        try:
            conn = await pool.get_connection()  # type: ignore[no-untyped-call]  # untyped in redis-py
        except (RedisError, OSError) as exc:
            return [_not_sent(exc)] * count
        try:
            self.round_trips += 1
            # redis-py's own stream pair (private): the pool has connected it (handshake,
            # AUTH, SELECT, TLS), and no reply of ours is left unread when it goes back
            reader: asyncio.StreamReader | None = conn._reader
            writer: asyncio.StreamWriter | None = conn._writer
            if reader is None or writer is None:
                raise RedisConnectionError("the pooled connection is not connected")
            parser = hiredis.Reader(replyError=ResponseError)
            async with asyncio.timeout(conn.socket_timeout):
                writer.write(data)
                await writer.drain()
                while len(replies) < count:
                    chunk = await reader.read(1 << 16)
                    if not chunk:
                        raise RedisConnectionError("connection closed by the server")
                    parser.feed(chunk)
                    reply = parser.gets()
                    while reply is not False:
                        replies.append(reply)
                        reply = parser.gets()
            if len(replies) > count:  # more replies than requests: the stream is out of step
                raise RedisError("more replies than commands")
        except (RedisError, OSError, TimeoutError, hiredis.ProtocolError) as exc:
            await conn.disconnect()  # replies may be half read: never reuse this connection
            if not replies and _dropped(exc):
                raise _Dropped(exc) from exc
            return [_unavailable(exc)] * count
        except BaseException:  # cancelled mid-batch: replies may be left unread on the stream
            await conn.disconnect()
            raise
        finally:
            await pool.release(conn)
        return replies

    async def _answer(self, plan: Plan, reply: object) -> Reply:
        """A reply that is not a script's array: reset's count, or an error (NOSCRIPT: EVAL)."""
        if _noscript(reply):
            try:
                self.round_trips += 1
                command = fallback(self.codec.command(plan))
                reply = await self.client.execute_command(*command)  # type: ignore[no-untyped-call]  # untyped in redis-py
            except (RedisError, OSError) as exc:
                reply = exc
        if isinstance(reply, BaseException):
            message = f"redis could not run {plan.op}: {type(reply).__name__}: {reply}"
            if _redirect(reply):
                return NotSent(message)  # a cluster node's redirect: it ran nothing
            return StoreUnavailable(message)
        if plan.op == "reset":
            return ()
        return outcomes(reply)  # type: ignore[arg-type]  # a script's array of integers


class _Dropped(Exception):
    """The connection was found closed before any reply was read: worth one retry."""

    def __init__(self, error: BaseException) -> None:
        super().__init__(str(error))
        self.error = error


def _dropped(exc: BaseException) -> bool:
    """A closed or reset connection, not a timeout (a timed-out batch may have run)."""
    if isinstance(exc, RedisTimeoutError | TimeoutError):
        return False
    return isinstance(exc, RedisConnectionError | ConnectionError)


def _unavailable(exc: BaseException) -> StoreUnavailable:
    return StoreUnavailable(f"redis pipeline failed: {type(exc).__name__}: {exc}")


def _noscript(reply: object) -> bool:
    """Redis' ``NOSCRIPT`` error reply: the script is not loaded on that server."""
    return isinstance(reply, ResponseError) and str(reply).startswith("NOSCRIPT")


def _redirect(reply: BaseException) -> bool:
    """A cluster node's ``MOVED``/``ASK``: parsed by redis-py (``AskError`` and its subclass
    ``MovedError``) or raw (``ResponseError`` text)."""
    if isinstance(reply, AskError):
        return True
    return isinstance(reply, ResponseError) and str(reply).startswith(("MOVED ", "ASK "))


def _not_sent(exc: BaseException) -> NotSent:
    return NotSent(f"redis pipeline not sent: {type(exc).__name__}: {exc}")
