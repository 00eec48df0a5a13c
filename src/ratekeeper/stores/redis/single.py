"""``RedisStore``: one Redis server (or a client you built), every plan one Lua script call.

What belongs here is I/O only: building clients, sending the codec's command, reloading a
script after ``NOSCRIPT``, and wrapping driver errors in ``StoreUnavailable``. Everything else
(keys, ARGV, reply parsing) is the sans-I/O ``codec``, so ``execute`` and
``execute_async`` differ only where ``await`` appears.

- ``hit``/``refund`` run ``EVALSHA``; ``peek`` runs ``EVALSHA_RO`` (Redis >= 7), which never
  writes and may be served by a replica; ``reset`` is a plain ``DEL`` of the stack's keys.
- After ``NOSCRIPT`` (a restarted or failed-over server, ``SCRIPT FLUSH``) the same call is sent
  once as ``EVAL`` with the source, which also re-caches the script: no extra round trip.
- Clients built from ``url`` get ``socket_timeout`` and ``socket_connect_timeout`` (default
  50 ms) and at most one immediate retry of a dropped connection, so a dead Redis costs a
  bounded time before the limiter's fail-open and circuit breaker take over.
- Async calls (plans and leases) that are in flight together are coalesced into one pipeline
  (``batching``; ``batching=None`` sends one ``EVALSHA`` per call) when the asyncio client is a
  plain ``redis.asyncio.Redis``. Sync calls are never batched.
- The asyncio side (client, batcher, pipeline, leases) is kept per event loop (``loops``): a
  second loop — another ``asyncio.run``, a thread with a loop of its own — gets clients of its
  own, built from the URL, from the function given as ``async_client``, or as a twin of the
  client given (same pool class and connection options).
- Leases (``LeaseStore``/``AsyncLeaseStore``, for the concurrency limiter and fleet shedder)
  are delegated to ``leases`` over the same clients, prefix and batcher.
- Nested calls and reservation steps (``NestedStore``) are one ``EVALSHA`` of the nested
  script each (``nested_codec``), batched with the rest when async.
- ``ping``/``ping_async`` check the server answers (at startup: building a store connects to
  nothing, so a wrong address would otherwise show only as degraded decisions); errors and
  ``repr`` name the server by ``address`` (``host:port/db``), never its password.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeVar

import redis
import redis.asyncio
from redis.asyncio.retry import Retry as AsyncRetry
from redis.backoff import NoBackoff
from redis.exceptions import NoScriptError, RedisError
from redis.retry import Retry

from ...algorithms import Outcome
from ...errors import ConfigError, StoreUnavailable
from ...nested import NestedPlan, NestedReply
from ...plan import Plan
from ..loops import PerLoop
from .batching import DEFAULT_BATCHING, Batcher, Batching
from .codec import Codec, Command, admin_outcomes, fallback, outcomes
from .layout import CompactLayout
from .leases import AsyncRedisLeases, RedisLeases
from .nested_codec import nested_command, nested_reply
from .pipeline import Call, RedisPipeline, Result
from .sentinel import aclose_manager
from .urls import address, check_url, redact, scrub

_R = TypeVar("_R", Retry, AsyncRetry)


def run_script(client: Any, command: Command) -> Any:
    """One script call: ``EVALSHA``, then ``EVAL`` with the source when Redis answers NOSCRIPT
    (after a restart, a failover or ``SCRIPT FLUSH``); the store's only round trip otherwise."""
    try:
        return client.execute_command(*command)
    except NoScriptError:
        return client.execute_command(*fallback(command))


async def run_script_async(client: Any, command: Command) -> Any:
    """``run_script`` on an asyncio client."""
    try:
        return await client.execute_command(*command)
    except NoScriptError:
        return await client.execute_command(*fallback(command))


def _check_timeout(socket_timeout: object) -> float:
    if (
        isinstance(socket_timeout, bool)
        or not isinstance(socket_timeout, int | float)
        or not 0 < socket_timeout <= 60
    ):
        raise ConfigError(
            f"socket_timeout={socket_timeout!r} is invalid; expected seconds, 0 < t <= 60"
        )
    return float(socket_timeout)


def client_options(socket_timeout: float) -> dict[str, Any]:
    """Connection options for clients built from a URL (shared with the sharded stores)."""
    return {
        "socket_timeout": socket_timeout,
        "socket_connect_timeout": socket_timeout,
        "retry_on_timeout": False,
    }


def _retry(kind: type[_R]) -> _R:
    """One immediate retry of a dropped connection (e.g. pooled before a restart), never of a
    timeout: a timed-out script may have run, and waiting twice doubles the cost of a stalled
    Redis."""
    return kind(NoBackoff(), 1, supported_errors=(redis.ConnectionError,))


def client_address(client: Any) -> str:
    """``host:port/db`` of a redis-py client (sync or asyncio), from its connection settings."""
    kwargs = getattr(getattr(client, "connection_pool", None), "connection_kwargs", {})
    if "path" in kwargs:
        return str(kwargs["path"])
    host, port = kwargs.get("host", "?"), kwargs.get("port", 6379)
    return f"{host}:{port}/{kwargs.get('db', 0)}"


AsyncClientSource = redis.asyncio.Redis | Callable[[], redis.asyncio.Redis]
"""An asyncio client, or a function building one (called once per event loop)."""


@dataclass(slots=True)
class _Async:
    """One event loop's asyncio side of a ``RedisStore``."""

    client: redis.asyncio.Redis
    pipeline: RedisPipeline | None
    batcher: Batcher[Call, Result] | None
    leases: AsyncRedisLeases


def _from_url(url: str, options: dict[str, Any]) -> Callable[[], redis.asyncio.Redis]:
    """A function building asyncio clients for ``url`` (one per event loop)."""

    def build() -> redis.asyncio.Redis:
        return redis.asyncio.Redis.from_url(url, retry=_retry(AsyncRetry), **options)

    return build


def twin_client(client: redis.asyncio.Redis) -> Callable[[], redis.asyncio.Redis]:
    """A function building clients like ``client`` (its pool's class and connection options),
    for event loops other than the one ``client`` serves; ``ConfigError`` for a pool that
    cannot be rebuilt from its options (pass a function building the client instead)."""
    pool = client.connection_pool
    if type(pool) not in (redis.asyncio.ConnectionPool, redis.asyncio.BlockingConnectionPool):
        raise ConfigError(
            f"async_client with a {type(pool).__name__} cannot be rebuilt for another event "
            "loop; pass a function that builds the client (called once per loop) instead"
        )
    kind, options = type(pool), dict(pool.connection_kwargs)
    connection_class, most = pool.connection_class, pool.max_connections

    def build() -> redis.asyncio.Redis:
        fresh = kind(connection_class=connection_class, max_connections=most, **options)
        return redis.asyncio.Redis(connection_pool=fresh)

    return build


class RedisStore:
    """Runs plans on one Redis with the algorithms' Lua twins."""

    def __init__(
        self,
        url: str | None = None,
        *,
        client: redis.Redis | None = None,
        async_client: AsyncClientSource | None = None,
        prefix: str = "rk",
        socket_timeout: float = 0.05,
        batching: Batching | None = DEFAULT_BATCHING,
        layout: CompactLayout | None = None,
        legacy_keys: bool = False,
    ) -> None:
        timeout = _check_timeout(socket_timeout)
        if url is None and client is None and async_client is None:
            raise ConfigError("RedisStore needs a url (redis://host:port/db) or a client")
        if batching is not None and not isinstance(batching, Batching):
            raise ConfigError(f"batching={batching!r} is invalid; expected Batching(...) or None")
        if url is not None:
            check_url(url)
        self.codec = Codec(prefix, layout, legacy_keys)
        self.prefix = prefix
        self._batching = batching
        options = client_options(timeout)
        build: Callable[[], redis.asyncio.Redis] | None = None
        try:
            if client is None and url is not None:
                client = redis.Redis.from_url(url, retry=_retry(Retry), **options)
            if async_client is None and url is not None:
                build = _from_url(url, options)
                async_client = build()
        except ValueError as exc:  # redis-py's message may quote the URL: ours is redacted
            raise ConfigError(
                f"url {redact(url)!r} is invalid: {scrub(str(exc), url or '')}"
            ) from None
        if async_client is not None and not isinstance(async_client, redis.asyncio.Redis):
            if not callable(async_client):
                raise ConfigError(
                    f"async_client={async_client!r} is invalid; expected a redis.asyncio.Redis "
                    "or a function building one"
                )
            build, async_client = async_client, async_client()
        self.client = client
        first = None if async_client is None else async_client
        self.address = address(url) if url is not None else client_address(client or first)
        self._loops: PerLoop[_Async] | None = None
        if first is not None:
            if build is None:
                build = twin_client(first)
            make = build
            self._loops = PerLoop(lambda: self._async_side(make()), self._async_side(first))
        self._leases = None if client is None else RedisLeases(client, prefix)

    def _async_side(self, client: redis.asyncio.Redis) -> _Async:
        """The batcher and leases over ``client``, for one event loop."""
        pipeline = batcher = None
        if self._batching is not None and isinstance(client, redis.asyncio.Redis):
            pipeline = RedisPipeline(client, self.codec)
            batcher = Batcher(pipeline, self._batching)
        submit = None if batcher is None else batcher.submit
        return _Async(client, pipeline, batcher, AsyncRedisLeases(client, self.prefix, submit))

    def _aio(self) -> _Async:
        loops = self._loops
        if loops is None:
            raise ConfigError("this RedisStore has only a sync client; use Limiter")
        return loops.get()

    @property
    def async_client(self) -> redis.asyncio.Redis | None:
        """The asyncio client of the running event loop (outside a loop: of the last loop)."""
        side = None if self._loops is None else self._loops.current()
        return None if side is None else side.client

    @property
    def batcher(self) -> Batcher[Call, Result] | None:
        """The batcher of the running event loop (outside a loop: of the last loop)."""
        side = None if self._loops is None else self._loops.current()
        return None if side is None else side.batcher

    def loops(self) -> int:
        """Event loops holding asyncio clients of this store now (see ``stores.loops``)."""
        return 0 if self._loops is None else self._loops.loops()

    def __repr__(self) -> str:
        return f"RedisStore({self.address!r}, prefix={self.prefix!r})"

    def ping(self) -> None:
        """Check the server answers; ``StoreUnavailable`` naming its address if not."""
        client = self.client
        if client is None:
            raise ConfigError("this RedisStore has only an async client; use ping_async")
        try:
            client.ping()
        except (RedisError, OSError) as exc:
            raise self._unreachable(exc) from exc

    async def ping_async(self) -> None:
        """``ping`` on the asyncio client."""
        if self._loops is None:
            raise ConfigError("this RedisStore has only a sync client; use ping")
        try:
            await self._loops.get().client.ping()
        except (RedisError, OSError) as exc:
            raise self._unreachable(exc) from exc

    def _unreachable(self, exc: BaseException) -> StoreUnavailable:
        return StoreUnavailable(
            f"redis at {self.address} does not answer: {type(exc).__name__}: {exc}"
        )

    def execute(self, plan: Plan) -> tuple[Outcome, ...]:
        """Run one plan with one script call (``reset``: one ``DEL``)."""
        client = self.client
        if client is None:
            raise ConfigError("this RedisStore has only an async client; use AsyncLimiter")
        try:
            if plan.op == "reset":
                client.execute_command(*self.codec.reset(plan))  # type: ignore[no-untyped-call]  # untyped in redis-py
                return ()
            command = self.codec.command(plan)
            reply = run_script(client, command)
        except (RedisError, OSError) as exc:
            raise _unavailable(plan, exc) from exc
        return outcomes(reply)

    def execute_soon(self, plan: Plan) -> asyncio.Future[tuple[Outcome, ...]] | None:
        """``plan`` queued in the batch of the calls in flight (``QueuingStore``); None
        without batching."""
        batcher = self._aio().batcher
        return None if batcher is None else batcher.enqueue(plan)

    async def execute_async(self, plan: Plan) -> tuple[Outcome, ...]:
        """The same as ``execute``, on the asyncio client: in the batch of the calls in flight
        (the batcher wraps errors in ``StoreUnavailable``), or alone without batching."""
        side = self._aio()
        batcher = side.batcher
        if batcher is not None:
            result: tuple[Outcome, ...] = await batcher.submit(plan)
            return result
        client = side.client
        try:
            if plan.op == "reset":
                await client.execute_command(*self.codec.reset(plan))  # type: ignore[no-untyped-call]  # untyped in redis-py
                return ()
            command: Command = self.codec.command(plan)
            reply = await run_script_async(client, command)
        except (RedisError, OSError) as exc:
            raise _unavailable(plan, exc) from exc
        return outcomes(reply)

    def execute_nested(self, plan: NestedPlan) -> NestedReply:
        """Run one nested plan with one script call (``NestedStore``)."""
        client = self.client
        if client is None:
            raise ConfigError("this RedisStore has only an async client; use AsyncLimiter")
        command = nested_command(self.codec, plan)
        try:
            reply = run_script(client, command)
        except (RedisError, OSError) as exc:
            raise _nested_unavailable(plan, exc) from exc
        return nested_reply(plan, reply)

    async def execute_nested_async(self, plan: NestedPlan) -> NestedReply:
        """The same as ``execute_nested``, on the asyncio client (in a batch when batching)."""
        side = self._aio()
        batcher = side.batcher
        if batcher is not None:
            result: NestedReply = await batcher.submit(plan)
            return result
        client = side.client
        command = nested_command(self.codec, plan)
        try:
            reply = await run_script_async(client, command)
        except (RedisError, OSError) as exc:
            raise _nested_unavailable(plan, exc) from exc
        return nested_reply(plan, reply)

    def administer(self, plan: Plan) -> tuple[tuple[Outcome, ...], tuple[Outcome, ...]]:
        """An admin's reset, credit or debit with the peeks before and after, in one script
        call (``AdminStore``)."""
        client = self.client
        if client is None:
            raise ConfigError("this RedisStore has only an async client; use AsyncLimiter")
        command = self.codec.admin(plan)
        try:
            reply = run_script(client, command)
        except (RedisError, OSError) as exc:
            raise _unavailable(plan, exc) from exc
        return admin_outcomes(reply)

    async def administer_async(self, plan: Plan) -> tuple[tuple[Outcome, ...], tuple[Outcome, ...]]:
        """The same as ``administer``, on the running event loop's asyncio client (never
        batched)."""
        client = self._aio().client
        command = self.codec.admin(plan)
        try:
            reply = await run_script_async(client, command)
        except (RedisError, OSError) as exc:
            raise _unavailable(plan, exc) from exc
        return admin_outcomes(reply)

    def execute_many(self, plans: list[Plan]) -> list[tuple[Outcome, ...]]:
        """Several hit/peek/refund plans in one pipelined round trip (``ManyStore``: the peeks
        of ``status``); a script missing after a restart is sent again as ``EVAL``."""
        client = self.client
        if client is None:
            raise ConfigError("this RedisStore has only an async client; use AsyncLimiter")
        if not plans:
            return []
        commands = [self.codec.command(plan) for plan in plans]
        try:
            pipe = client.pipeline(transaction=False)
            for command in commands:
                pipe.execute_command(*command)  # type: ignore[no-untyped-call]  # untyped in redis-py
            replies = pipe.execute(raise_on_error=False)
            out = []
            for command, reply in zip(commands, replies, strict=True):
                if isinstance(reply, NoScriptError):
                    reply = client.execute_command(*fallback(command))  # type: ignore[no-untyped-call]  # untyped in redis-py
                elif isinstance(reply, Exception):
                    raise reply
                out.append(outcomes(reply))
        except (RedisError, OSError) as exc:
            raise _unavailable(plans[0], exc) from exc
        return out

    async def execute_many_async(self, plans: list[Plan]) -> list[tuple[Outcome, ...]]:
        """The same as ``execute_many``: in the batch of the calls in flight (one pipeline)."""
        return list(await asyncio.gather(*(self.execute_async(plan) for plan in plans)))

    def _sync_leases(self) -> RedisLeases:
        if self._leases is None:
            raise ConfigError("this RedisStore has only an async client; use the Async classes")
        return self._leases

    def _aio_leases(self) -> AsyncRedisLeases:
        if self._loops is None:
            raise ConfigError("this RedisStore has only a sync client; use the sync classes")
        return self._loops.get().leases

    def acquire_lease(
        self, key: str, lease_id: str, capacity: int, now_ms: int, expires_ms: int
    ) -> tuple[bool, int]:
        """Sweep, count and add one lease in one script (``LeaseStore``)."""
        return self._sync_leases().acquire_lease(key, lease_id, capacity, now_ms, expires_ms)

    def release_lease(self, key: str, lease_id: str, now_ms: int) -> bool:
        """Remove one lease (``LeaseStore``)."""
        return self._sync_leases().release_lease(key, lease_id, now_ms)

    def count_leases(self, key: str, now_ms: int) -> int:
        """Live leases of ``key`` (``LeaseStore``)."""
        return self._sync_leases().count_leases(key, now_ms)

    async def acquire_lease_async(
        self, key: str, lease_id: str, capacity: int, now_ms: int, expires_ms: int
    ) -> tuple[bool, int]:
        """The same as ``acquire_lease``, on the asyncio client."""
        leases = self._aio_leases()
        return await leases.acquire_lease_async(key, lease_id, capacity, now_ms, expires_ms)

    async def release_lease_async(self, key: str, lease_id: str, now_ms: int) -> bool:
        """The same as ``release_lease``, on the asyncio client."""
        return await self._aio_leases().release_lease_async(key, lease_id, now_ms)

    async def count_leases_async(self, key: str, now_ms: int) -> int:
        """The same as ``count_leases``, on the asyncio client."""
        return await self._aio_leases().count_leases_async(key, now_ms)

    def close(self) -> None:
        """Close the sync client's connections (the async client: ``await aclose()``)."""
        if self.client is not None:
            self.client.close()

    async def aclose(self) -> None:
        """Close the running event loop's asyncio connections (a loop that closed has its
        dropped when the next loop uses the store; see ``stores.loops``)."""
        side = None if self._loops is None else self._loops.pop_running()
        if side is None:
            return
        if side.pipeline is not None:
            await side.pipeline.release_kept()
        await side.client.aclose()
        await aclose_manager(side.client)  # a Sentinel client's manager, if any


def _unavailable(plan: Plan, exc: BaseException) -> StoreUnavailable:
    return StoreUnavailable(
        f"redis could not run {plan.op} for {plan.policy.algorithm.NAME}: "
        f"{type(exc).__name__}: {exc}"
    )


def _nested_unavailable(plan: NestedPlan, exc: BaseException) -> StoreUnavailable:
    return StoreUnavailable(
        f"redis could not run nested {plan.op} of {len(plan.levels)} levels: "
        f"{type(exc).__name__}: {exc}"
    )
