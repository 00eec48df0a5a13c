"""``RedisClusterStore``: the Redis scripts on a Redis Cluster, through redis-py's cluster client.

What belongs here is the cluster's I/O: building the cluster clients, sending the codec's
command, reloading a script after ``NOSCRIPT``, wrapping driver errors. Plans become commands in
the shared sans-I/O ``codec``, as for ``RedisStore``.

- **Atomic stacks**: every key of one call carries the caller key's hash tag
  (``rk{tag}...``), so all rates of a stack sit in one slot and one script call sees them all.
- **Redirects**: the cluster client routes each script call by that slot and follows ``MOVED``
  (a resharded slot: it refreshes its slot map) and ``ASK`` (a slot mid-migration).
- **Peeks** are sent as ``EVALSHA``, not ``EVALSHA_RO``: the cluster client computes
  ``EVALSHA``'s slot itself but asks the server (``COMMAND GETKEYS``, one more round trip) for
  ``EVALSHA_RO``'s, and reads go to primaries anyway. The peek script never writes either way.
- **Discovery is lazy**: the sync client is built (which asks a node for the slot map) on first
  use, so an application starts while the cluster is down and fails open until it is back.
  The asyncio client loads the slot map (``initialize``, which holds its own lock) before its
  first command: concurrent first commands on a fresh redis-py asyncio cluster client
  otherwise race its discovery and fail with "Connection closed by server" (seen with
  redis-py 8.1: 9 concurrent first calls, most failed; none once it was initialized).
- Connections get ``socket_timeout`` and ``socket_connect_timeout``, and the cluster client no
  retries (its retry count would also retry timeouts: a stalled node would cost twice the
  timeout, and a timed-out hit could run twice), so a stalled node costs one ``socket_timeout``
  per call (measured: 55 ms at the 50 ms default; a killed node a few ms: a topology refresh)
  before the limiter's fail-open and circuit breaker take over. A dropped connection fails that
  one call (fail-open); the next call reconnects. Redirects (``MOVED``/``ASK``) are not retries
  and are always followed. The cluster is one failure domain (with
  ``cluster-require-full-coverage``, a cluster missing a primary refuses every key anyway).
- **Batching**: async calls (plans and leases) in flight together ride in one pipeline per
  cluster primary (``cluster_batching.ClusterBatcher``), when the store is built from a URL;
  ``batching=None`` sends each through the cluster client. Sync calls are never batched.
- **Nested calls** (``NestedStore``) carry the outermost level's hash tag on every key
  (``nested_codec``): one slot, one script. An inner level's counter lives under that tag,
  so it belongs to the outer key (``user:42`` under two orgs is two counters, as on every
  store).
- **Event loops**: the asyncio cluster client, its slot map and the batcher are kept per loop
  (``loops.PerLoop``), built from the URL or a function given as ``async_client``.
- **Leases** (``LeaseStore``/``AsyncLeaseStore``, for the concurrency limiter and the fleet
  shedder) are ``redis.leases`` over the same cluster clients and prefix: a caller key's lease
  set carries its hash tag, so the cluster client sends each script call to the slot's
  primary. Cluster-client errors are wrapped in ``StoreUnavailable`` here too.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable
from typing import Any

import redis
import redis.asyncio
from redis.asyncio.retry import Retry as AsyncRetry
from redis.backoff import NoBackoff
from redis.exceptions import NoScriptError, RedisClusterException, RedisError
from redis.retry import Retry

from ...algorithms import Outcome
from ...errors import ConfigError, StoreUnavailable
from ...nested import NestedPlan, NestedReply
from ...plan import Plan
from ..loops import PerLoop
from .batching import DEFAULT_BATCHING, Batching
from .cluster_batching import ClusterBatcher
from .codec import Codec, Command, admin_outcomes, fallback, outcomes
from .layout import CompactLayout
from .leases import AsyncRedisLeases, LeaseCall, RedisLeases
from .nested_codec import nested_command, nested_reply
from .pipeline import Call
from .single import _check_timeout, client_options, run_script, run_script_async
from .urls import address, check_url

_ERRORS = (RedisError, RedisClusterException, OSError)


def _options(socket_timeout: float) -> dict[str, float]:
    """Timeouts for every node connection (the cluster clients take no ``retry_on_timeout``)."""
    return {"socket_timeout": socket_timeout, "socket_connect_timeout": socket_timeout}


def _on_primary(command: Command) -> Command:
    """``EVALSHA_RO`` -> ``EVALSHA``, whose slot the cluster client finds without asking."""
    return ("EVALSHA", *command[1:]) if command[0] == "EVALSHA_RO" else command


class RedisClusterStore:
    """Runs plans on a Redis Cluster; ``url`` is any node, the rest are discovered."""

    def __init__(
        self,
        url: str | None = None,
        *,
        client: redis.RedisCluster | None = None,
        async_client: redis.asyncio.RedisCluster
        | Callable[[], redis.asyncio.RedisCluster]
        | None = None,
        prefix: str = "rk",
        socket_timeout: float = 0.05,
        batching: Batching | None = DEFAULT_BATCHING,
        layout: CompactLayout | None = None,
        legacy_keys: bool = False,
    ) -> None:
        self.socket_timeout = _check_timeout(socket_timeout)
        if batching is not None and not isinstance(batching, Batching):
            raise ConfigError(f"batching={batching!r} is invalid; expected Batching(...) or None")
        if url is None and client is None and async_client is None:
            raise ConfigError("RedisClusterStore needs a url (redis://host:port) or a client")
        if url is not None:
            check_url(url, "cluster url", cluster=True)
        self.url = url
        self.codec = Codec(prefix, layout, legacy_keys)
        self.prefix = prefix
        self.client = client
        self._lock = threading.Lock()
        self._batching = batching
        self._leases: RedisLeases | None = None
        given: redis.asyncio.RedisCluster | None = None
        build: Callable[[], redis.asyncio.RedisCluster] | None = None
        if isinstance(async_client, redis.asyncio.RedisCluster):
            if url is None:
                raise ConfigError(
                    "RedisClusterStore(async_client=<a RedisCluster>) cannot build clients for "
                    "other event loops; give the url too, or a function building the client "
                    "(called once per loop)"
                )
            given, build = async_client, self._from_url
        elif async_client is not None:
            if not callable(async_client):
                raise ConfigError(
                    f"async_client={async_client!r} is invalid; expected a "
                    "redis.asyncio.RedisCluster or a function building one"
                )
            build = async_client
        elif url is not None:
            build = self._from_url
        self._loops: PerLoop[_ClusterAsync] | None = None
        if build is not None:
            first = given if given is not None else build()
            make = build
            self._loops = PerLoop(lambda: self._async_side(make()), self._async_side(first))

    def _from_url(self) -> redis.asyncio.RedisCluster:
        assert self.url is not None  # only chosen with a url
        return redis.asyncio.RedisCluster.from_url(
            self.url, retry=AsyncRetry(NoBackoff(), 0), **_options(self.socket_timeout)
        )

    def _async_side(self, client: redis.asyncio.RedisCluster) -> _ClusterAsync:
        """The batcher and leases over ``client``, for one event loop."""
        side = _ClusterAsync(client, AsyncRedisLeases(client, self.prefix))
        if self._batching is not None and self.url is not None:

            async def ready() -> None:
                await self._ready(side)

            async def direct(call: Call) -> tuple[Any, ...]:
                return await self._direct(side, call)

            side.batcher = ClusterBatcher(
                client, self.url, self.codec, client_options(self.socket_timeout), self._batching,
                ready, direct,
            )  # fmt: skip
        submit = None if side.batcher is None else side.batcher.submit
        side.leases = AsyncRedisLeases(client, self.prefix, submit)
        return side

    def _aio(self) -> _ClusterAsync:
        loops = self._loops
        if loops is None:
            raise ConfigError("this RedisClusterStore has only a sync client; use Limiter")
        return loops.get()

    @property
    def async_client(self) -> redis.asyncio.RedisCluster | None:
        """The asyncio cluster client of the running event loop (outside one: of the last)."""
        side = None if self._loops is None else self._loops.current()
        return None if side is None else side.client

    @property
    def batcher(self) -> ClusterBatcher | None:
        """The running event loop's batcher (outside a loop: the last loop's)."""
        side = None if self._loops is None else self._loops.current()
        return None if side is None else side.batcher

    def loops(self) -> int:
        """Event loops holding asyncio clients of this store now (see ``stores.loops``)."""
        return 0 if self._loops is None else self._loops.loops()

    def __repr__(self) -> str:
        return f"RedisClusterStore({self.address!r}, prefix={self.prefix!r})"

    @property
    def address(self) -> str:
        """The seed node's ``host:port`` (never a password), for logs and errors."""
        return address(self.url).rsplit("/", 1)[0] if self.url else "(a cluster client)"

    def ping(self) -> None:
        """Check the cluster answers (the slot map loads, every primary replies to PING);
        ``StoreUnavailable`` naming the seed node if not."""
        try:
            self._sync_client().ping(target_nodes=redis.RedisCluster.PRIMARIES)
        except _ERRORS as exc:
            raise self._unreachable(exc) from exc

    async def ping_async(self) -> None:
        """``ping`` on the asyncio cluster client."""
        if self._loops is None:
            raise ConfigError("this RedisClusterStore has only a sync client; use ping")
        side = self._loops.get()
        try:
            await self._ready(side)
            await side.client.ping(target_nodes=redis.asyncio.RedisCluster.PRIMARIES)
        except _ERRORS as exc:
            raise self._unreachable(exc) from exc

    def _unreachable(self, exc: BaseException) -> StoreUnavailable:
        return StoreUnavailable(
            f"redis cluster at {self.address} does not answer: {type(exc).__name__}: {exc}"
        )

    def _sync_client(self) -> redis.RedisCluster:
        client = self.client
        if client is None:
            if self.url is None:
                raise ConfigError(
                    "this RedisClusterStore has only an async client; use AsyncLimiter"
                )
            with self._lock:
                if self.client is None:
                    self.client = redis.RedisCluster.from_url(
                        self.url, retry=Retry(NoBackoff(), 0), **_options(self.socket_timeout)
                    )
                client = self.client
        return client

    def execute(self, plan: Plan) -> tuple[Outcome, ...]:
        """Run one plan with one script call on the slot's primary (``reset``: one ``DEL``)."""
        try:
            client = self._sync_client()
            if plan.op == "reset":
                client.execute_command(*self.codec.reset(plan))  # type: ignore[no-untyped-call]  # untyped in redis-py
                return ()
            command = _on_primary(self.codec.command(plan))
            reply = run_script(client, command)
        except _ERRORS as exc:
            raise _unavailable(plan, exc) from exc
        return outcomes(reply)

    def administer(self, plan: Plan) -> tuple[tuple[Outcome, ...], tuple[Outcome, ...]]:
        """An admin's change and the peeks before and after, in one script call on the
        slot's primary (``AdminStore``)."""
        command = self.codec.admin(plan)
        try:
            client = self._sync_client()
            reply = run_script(client, command)
        except _ERRORS as exc:
            raise _unavailable(plan, exc) from exc
        return admin_outcomes(reply)

    async def administer_async(self, plan: Plan) -> tuple[tuple[Outcome, ...], tuple[Outcome, ...]]:
        """The same as ``administer``, on the running event loop's asyncio cluster client
        (never batched)."""
        side = self._aio()
        client = side.client
        command = self.codec.admin(plan)
        try:
            await self._ready(side)
            reply = await run_script_async(client, command)
        except _ERRORS as exc:
            raise _unavailable(plan, exc) from exc
        return admin_outcomes(reply)

    def execute_many(self, plans: list[Plan]) -> list[tuple[Outcome, ...]]:
        """Several plans through one cluster pipeline: plans of one caller key are one slot,
        so one round trip to its primary (``ManyStore``); after ``NOSCRIPT`` each plan that
        missed its script is sent again alone."""
        if not plans:
            return []
        commands = [_on_primary(self.codec.command(plan)) for plan in plans]
        try:
            client = self._sync_client()
            pipe = client.pipeline()  # type: ignore[no-untyped-call]  # untyped in redis-py
            for command in commands:
                pipe.execute_command(*command)
            replies = pipe.execute(raise_on_error=False)
            out = []
            for command, reply in zip(commands, replies, strict=True):
                if isinstance(reply, NoScriptError):
                    reply = client.execute_command(*fallback(command))  # type: ignore[no-untyped-call]  # untyped in redis-py
                elif isinstance(reply, Exception):
                    raise reply
                out.append(outcomes(reply))
        except _ERRORS as exc:
            raise _unavailable(plans[0], exc) from exc
        return out

    async def execute_many_async(self, plans: list[Plan]) -> list[tuple[Outcome, ...]]:
        """The same as ``execute_many``: the calls ride in their primary's batch."""
        return list(await asyncio.gather(*(self.execute_async(plan) for plan in plans)))

    async def ready(self) -> None:
        """Load the running event loop's asyncio client's slot map if it is not loaded yet
        (the service's batcher routes plans by it)."""
        await self._ready(self._aio())

    async def _ready(self, side: _ClusterAsync) -> None:
        """Load the slot map once before the first command (see the module docstring)."""
        if not side.ready:
            await side.client.initialize()
            side.ready = True

    async def execute_async(self, plan: Plan) -> tuple[Outcome, ...]:
        """The same as ``execute``, on the asyncio cluster client: in its primary's batch of the
        calls in flight, or alone without batching."""
        side = self._aio()
        if side.batcher is not None:
            result: tuple[Outcome, ...] = await side.batcher.submit(plan)
            return result
        return await self._execute_async(side, plan)

    async def _direct(self, side: _ClusterAsync, call: Call) -> tuple[Any, ...]:
        """One call through the cluster client, never batched (the batcher's way round a
        redirect or a lost node)."""
        if isinstance(call, LeaseCall):
            try:
                return await side.direct_leases.run(call)
            except _ERRORS as exc:
                raise _lease_unavailable(exc) from exc
        if type(call) is NestedPlan:
            return await self._nested_async(side, call)
        assert isinstance(call, Plan)
        return await self._execute_async(side, call)

    def execute_nested(self, plan: NestedPlan) -> NestedReply:
        """Run one nested plan with one script call on its slot's primary (``NestedStore``)."""
        command = nested_command(self.codec, plan)
        try:
            client = self._sync_client()
            reply = run_script(client, command)
        except _ERRORS as exc:
            raise _nested_unavailable(plan, exc) from exc
        return nested_reply(plan, reply)

    async def execute_nested_async(self, plan: NestedPlan) -> NestedReply:
        """The same as ``execute_nested``, on the running event loop's asyncio cluster client
        (batched per primary when batching)."""
        side = self._aio()
        if side.batcher is not None:
            result: NestedReply = await side.batcher.submit(plan)
            return result
        return await self._nested_async(side, plan)

    async def _nested_async(self, side: _ClusterAsync, plan: NestedPlan) -> NestedReply:
        client = side.client
        command = nested_command(self.codec, plan)
        try:
            await self._ready(side)
            reply = await run_script_async(client, command)
        except _ERRORS as exc:
            raise _nested_unavailable(plan, exc) from exc
        return nested_reply(plan, reply)

    async def _execute_async(self, side: _ClusterAsync, plan: Plan) -> tuple[Outcome, ...]:
        client = side.client
        try:
            await self._ready(side)
            if plan.op == "reset":
                await client.execute_command(*self.codec.reset(plan))
                return ()
            command = _on_primary(self.codec.command(plan))
            reply = await run_script_async(client, command)
        except _ERRORS as exc:
            raise _unavailable(plan, exc) from exc
        return outcomes(reply)

    def _sync_leases(self) -> RedisLeases:
        leases = self._leases
        if leases is None:
            client = self._sync_client()
            with self._lock:
                if self._leases is None:
                    self._leases = RedisLeases(client, self.prefix)
                leases = self._leases
        return leases

    async def _aio_leases(self) -> AsyncRedisLeases:
        if self._loops is None:
            raise ConfigError("this RedisClusterStore has only a sync client; use the sync classes")
        side = self._loops.get()
        await self._ready(side)
        return side.leases

    def acquire_lease(
        self, key: str, lease_id: str, capacity: int, now_ms: int, expires_ms: int
    ) -> tuple[bool, int]:
        """Sweep, count and add one lease in one script on the slot's primary (``LeaseStore``)."""
        try:
            return self._sync_leases().acquire_lease(key, lease_id, capacity, now_ms, expires_ms)
        except _ERRORS as exc:
            raise _lease_unavailable(exc) from exc

    def release_lease(self, key: str, lease_id: str, now_ms: int) -> bool:
        """Remove one lease (``LeaseStore``)."""
        try:
            return self._sync_leases().release_lease(key, lease_id, now_ms)
        except _ERRORS as exc:
            raise _lease_unavailable(exc) from exc

    def count_leases(self, key: str, now_ms: int) -> int:
        """Live leases of ``key`` (``LeaseStore``)."""
        try:
            return self._sync_leases().count_leases(key, now_ms)
        except _ERRORS as exc:
            raise _lease_unavailable(exc) from exc

    async def acquire_lease_async(
        self, key: str, lease_id: str, capacity: int, now_ms: int, expires_ms: int
    ) -> tuple[bool, int]:
        """The same as ``acquire_lease``, on the asyncio cluster client."""
        try:
            leases = await self._aio_leases()
            return await leases.acquire_lease_async(key, lease_id, capacity, now_ms, expires_ms)
        except _ERRORS as exc:
            raise _lease_unavailable(exc) from exc

    async def release_lease_async(self, key: str, lease_id: str, now_ms: int) -> bool:
        """The same as ``release_lease``, on the asyncio cluster client."""
        try:
            return await (await self._aio_leases()).release_lease_async(key, lease_id, now_ms)
        except _ERRORS as exc:
            raise _lease_unavailable(exc) from exc

    async def count_leases_async(self, key: str, now_ms: int) -> int:
        """The same as ``count_leases``, on the asyncio cluster client."""
        try:
            return await (await self._aio_leases()).count_leases_async(key, now_ms)
        except _ERRORS as exc:
            raise _lease_unavailable(exc) from exc

    def close(self) -> None:
        """Close the sync client's connections (the async client: ``await aclose()``)."""
        if self.client is not None:
            self.client.close()

    async def aclose(self) -> None:
        """Close the running event loop's async connections (the cluster client's and the
        batcher's per-node ones; see ``stores.loops`` for loops that closed)."""
        side = None if self._loops is None else self._loops.pop_running()
        if side is None:
            return
        if side.batcher is not None:
            await side.batcher.aclose()
        await side.client.aclose()


class _ClusterAsync:
    """One event loop's asyncio side of a ``RedisClusterStore``: its cluster client (and
    whether its slot map is loaded), batcher and leases."""

    __slots__ = ("batcher", "client", "direct_leases", "leases", "ready")

    def __init__(self, client: redis.asyncio.RedisCluster, leases: AsyncRedisLeases) -> None:
        self.client = client
        self.ready = False
        self.batcher: ClusterBatcher | None = None
        self.direct_leases = leases
        self.leases = leases


def _unavailable(plan: Plan, exc: BaseException) -> StoreUnavailable:
    return StoreUnavailable(
        f"redis cluster could not run {plan.op} for {plan.policy.algorithm.NAME}: "
        f"{type(exc).__name__}: {exc}"
    )


def _nested_unavailable(plan: NestedPlan, exc: BaseException) -> StoreUnavailable:
    return StoreUnavailable(
        f"redis cluster could not run nested {plan.op} of {len(plan.levels)} levels: "
        f"{type(exc).__name__}: {exc}"
    )


def _lease_unavailable(exc: BaseException) -> StoreUnavailable:
    return StoreUnavailable(f"redis cluster lease store failed: {type(exc).__name__}: {exc}")
