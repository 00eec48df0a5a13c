"""``RedisPipeline``: a batch of calls on one Redis as one pipelined write and its replies.

A call is a ``Plan`` (encoded by the Redis codec, so batched decisions are the same as
``RedisStore``'s), a ``NestedPlan`` (``nested_codec``) or a ``LeaseCall``. No MULTI: each
script is atomic on its own, and a batch needs no more. After ``NOSCRIPT`` replies (a
restarted or flushed Redis) the first call that missed each script goes as ``EVAL`` with the
source (which re-caches it) and the others are re-sent as one batch; a call that misses it
again falls back to ``EVAL`` on its own. A
``reset`` (a plain ``DEL``, which never misses a script) starts a round trip of its own, so it
can never overtake a call queued before it.

Requests are encoded (``Codec.packed``: per-policy pieces encoded once) into one buffer, written
on one pooled connection, and the replies are parsed by a ``hiredis.Reader`` fed straight from
the connection's stream, under one timeout for the whole batch: per decision, redis-py's command
machinery (its ``Pipeline``, even its per-reply ``read_response`` with a timeout context each)
costs more than everything else the batch does. A connection that answered a whole batch is
kept for the next one (up to ``KEEP`` of them) instead of going back to the pool, whose
checkout and return (a lock, a readiness check, its own bookkeeping) cost about as much as
encoding a batch; a connection that failed goes back, and so do the kept ones, since a failure
usually means the server restarted or changed.

Errors come back per call: ``StoreUnavailable``, or ``NotSent`` when nothing ran (no
connection, a connection lost before any reply, a cluster node's ``MOVED``/``ASK``). A
``READONLY`` reply (the server was demoted to a replica) also drops the connection, so the
next batch connects again (through Sentinel, for a Sentinel shard).
"""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine, Sequence
from typing import Any

import hiredis
import redis.asyncio
from redis.exceptions import AskError, RedisError, ResponseError
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError

from ...errors import NotSent, StoreUnavailable
from ...nested import NestedPlan
from ...plan import Plan
from .codec import Codec, Command, fallback, outcomes, pack
from .leases import LeaseCall, lease_reply
from .nested_codec import nested_command, nested_reply

Call = Plan | NestedPlan | LeaseCall
Result = tuple[Any, ...]
"""A plan's outcomes (empty for refund and reset), a nested plan's ``NestedReply``, or a lease
call's two integers."""
Reply = Result | BaseException


KEEP = 4
"""Connections a pipeline keeps between batches (several batches can be out at once)."""


class RedisPipeline:
    """``execute_many`` for one Redis: a batch of calls is one pipelined round trip."""

    def __init__(self, client: redis.asyncio.Redis, codec: Codec) -> None:
        self.client = client
        self.codec = codec
        self.round_trips = 0
        self._kept: list[Any] = []
        """Connections taken from the pool that answered their last batch whole."""

    def _packed(self, call: Call) -> bytes:
        if type(call) is Plan:
            if call.op == "reset":
                return pack(self.codec.reset(call))
            return self.codec.packed(call)
        if type(call) is NestedPlan:
            return pack(nested_command(self.codec, call))
        assert isinstance(call, LeaseCall)
        return pack(call.command(self.codec.prefix))

    def _fallback(self, call: Call) -> Command:
        if type(call) is Plan:
            return fallback(self.codec.command(call))
        if type(call) is NestedPlan:
            return fallback(nested_command(self.codec, call))
        assert isinstance(call, LeaseCall)
        return call.fallback(self.codec.prefix)

    def __call__(self, calls: Sequence[Call]) -> Coroutine[Any, Any, list[Reply]]:
        """The batch's replies, in order (the coroutine itself: no layer of its own)."""
        resets = [
            i for i, call in enumerate(calls) if i and type(call) is Plan and call.op == "reset"
        ]
        if not resets:
            return self._run(calls)
        return self._split(calls, resets)

    async def _split(self, calls: Sequence[Call], resets: list[int]) -> list[Reply]:
        """A reset is not a script: after NOSCRIPT it would have run before the scripts queued
        ahead of it, which run again later. Each reset starts a batch of its own."""
        out: list[Reply] = []
        for start, end in zip([0, *resets], [*resets, len(calls)], strict=True):
            out += await self._run(calls[start:end])
        return out

    async def _run(self, calls: Sequence[Call]) -> list[Reply]:
        packed = [self._packed(call) for call in calls]
        replies = await self._send(b"".join(packed), len(packed))
        missing = [] if _all_lists(replies) else _missing(replies)
        if missing:  # a restarted or flushed Redis: load each script once, send those again
            replies = await self._reload_and_resend(calls, packed, replies, missing)
        out: list[Reply] = []
        for call, reply in zip(calls, replies, strict=True):
            if type(reply) is list and type(call) is Plan:  # the common case: a script's integers
                out.append(outcomes(reply))
            else:
                out.append(await self._answer(call, reply))
        return out

    async def _reload_and_resend(
        self, calls: Sequence[Call], packed: list[bytes], replies: list[object], missing: list[int]
    ) -> list[object]:
        """Send the first call that missed each script as ``EVAL`` with the source (which puts
        the script back in Redis' cache), then the other missed calls again as one batch: a
        burst after a restart costs a few round trips, not one ``EVAL`` per call, and needs
        no command beyond the script calls (no ``SCRIPT LOAD``). A call still missing its
        script afterwards falls back to ``EVAL`` in ``_answer``."""
        out = list(replies)
        again: list[int] = []
        seen: set[str] = set()
        for i in missing:
            source = self._fallback(calls[i])[1]
            if source in seen:
                again.append(i)
            else:
                seen.add(source)
                out[i] = await self._eval(calls[i])
        if again:
            resent = await self._send(b"".join(packed[i] for i in again), len(again))
            for i, reply in zip(again, resent, strict=True):
                out[i] = reply
        return out

    async def _eval(self, call: Call) -> object:
        """``call`` alone as ``EVAL`` with its script's source; its reply, or the error."""
        try:
            self.round_trips += 1
            return await self.client.execute_command(*self._fallback(call))  # type: ignore[no-untyped-call]  # untyped in redis-py
        except (RedisError, OSError) as exc:
            return exc

    async def _send(self, data: bytes, count: int, retry: bool = True) -> list[object]:
        """Write the batch on one pooled connection and read its ``count`` replies in order.

        A connection that drops before any reply is read (one pooled before a Redis restart)
        is retried once at once on a fresh connection (``retry``), as ``RedisStore`` does; a
        timeout or a drop after replies began is never retried (the scripts may have run).
        """
        pool = self.client.connection_pool
        replies: list[object] = []
        if self._kept:
            conn = self._kept.pop()
        else:
            try:
                conn = await pool.get_connection()  # type: ignore[no-untyped-call]  # untyped in redis-py
            except (RedisError, OSError) as exc:
                return [_not_sent(exc)] * count
        keep = False
        dropped: BaseException | None = None
        try:
            self.round_trips += 1
            # redis-py's own stream pair (private): the pool has connected it (handshake,
            # AUTH, SELECT, TLS), and no reply of ours is left unread when it goes back
            reader: asyncio.StreamReader | None = conn._reader
            writer: asyncio.StreamWriter | None = conn._writer
            if reader is None or writer is None:
                raise RedisConnectionError("the pooled connection is not connected")
            parser = hiredis.Reader(replyError=ResponseError)
            timer = _Deadline(conn.socket_timeout)  # asyncio.timeout's job, cheaper per batch
            try:
                writer.write(data)
                if writer.transport.get_write_buffer_size():  # else drain has nothing to do
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
            except asyncio.CancelledError:
                timer.check()  # TimeoutError when it was the deadline that cancelled
                raise
            finally:
                timer.cancel()
            if len(replies) > count:  # more replies than requests: the stream is out of step
                raise RedisError("more replies than commands")
            if not _all_lists(replies) and any(_readonly(reply) for reply in replies):
                # a primary demoted to a replica (a failover): a Sentinel pool's next
                # connection asks Sentinel for the new primary
                await conn.disconnect()
                await self.release_kept()
            else:
                keep = len(self._kept) < KEEP
        except (RedisError, OSError, TimeoutError, hiredis.ProtocolError) as exc:
            await conn.disconnect()  # replies may be half read: never reuse this connection
            await self.release_kept()  # likely as stale (a restart): the pool checks its own
            if not replies and _dropped(exc):
                dropped = exc
            else:
                return [_unavailable(exc)] * count
        except BaseException:  # cancelled mid-batch: replies may be left unread on the stream
            await conn.disconnect()
            raise
        finally:
            if keep:
                self._kept.append(conn)
            else:
                await pool.release(conn)
        if dropped is None:
            return replies
        if retry:
            return await self._send(data, count, retry=False)
        return [_not_sent(dropped)] * count

    async def release_kept(self) -> None:
        """Give the kept connections back to the pool (which checks them before reuse)."""
        kept, self._kept = self._kept, []
        for conn in kept:
            await self.client.connection_pool.release(conn)

    async def _answer(self, call: Call, reply: object) -> Reply:
        """A reply that is not a plan script's array: a lease's, reset's count, or an error
        (NOSCRIPT: ``EVAL``)."""
        if _noscript(reply):
            reply = await self._eval(call)
        what = call.op if isinstance(call, Plan | NestedPlan) else "a lease call"
        if isinstance(reply, BaseException):
            message = f"redis could not run {what}: {type(reply).__name__}: {reply}"
            if _redirect(reply):
                return NotSent(message)  # a cluster node's redirect: it ran nothing
            return StoreUnavailable(message)
        if type(call) is NestedPlan:
            return nested_reply(call, reply)  # type: ignore[arg-type]  # a script's array
        if type(call) is not Plan:
            return lease_reply(reply)
        if call.op == "reset":
            return ()
        return outcomes(reply)  # type: ignore[arg-type]  # a script's array of integers


class _Deadline:
    """Cancels the current task after ``seconds`` (None: never), as ``asyncio.timeout`` does,
    with one timer and no context manager: about a quarter of its cost, paid per batch."""

    __slots__ = ("expired", "task", "timer")

    def __init__(self, seconds: float | None) -> None:
        self.expired = False
        self.task = asyncio.current_task()
        self.timer = (
            None
            if seconds is None or self.task is None
            else asyncio.get_running_loop().call_later(seconds, self._expire)
        )

    def _expire(self) -> None:
        self.expired = True
        assert self.task is not None
        self.task.cancel()

    def check(self) -> None:
        """In ``except CancelledError``: raise ``TimeoutError`` if the deadline cancelled the
        task (and nothing else did), so the caller sees a timeout, not a cancellation."""
        if self.expired and self.task is not None and self.task.uncancel() == 0:
            raise TimeoutError("the batch took longer than the socket timeout") from None

    def cancel(self) -> None:
        if self.timer is not None:
            self.timer.cancel()


def _dropped(exc: BaseException) -> bool:
    """A closed or reset connection, not a timeout (a timed-out batch may have run)."""
    if isinstance(exc, RedisTimeoutError | TimeoutError):
        return False
    return isinstance(exc, RedisConnectionError | ConnectionError)


def _unavailable(exc: BaseException) -> StoreUnavailable:
    return StoreUnavailable(f"redis pipeline failed: {type(exc).__name__}: {exc}")


def _all_lists(replies: list[object]) -> bool:
    """Every reply a script's array (the usual batch): no error to look for."""
    return set(map(type, replies)) == _LIST


_LIST = {list}


def _missing(replies: list[object]) -> list[int]:
    """Where the replies are ``NOSCRIPT`` errors."""
    return [i for i, reply in enumerate(replies) if _noscript(reply)]


def _readonly(reply: object) -> bool:
    """Redis' ``READONLY`` error: the server is a replica now; the script wrote nothing."""
    return isinstance(reply, ResponseError) and str(reply).startswith("READONLY")


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
