"""Running the service: build the store, limiter and engine from a config, serve HTTP
(``http.server``) and gRPC (``grpc.aio``) on one event loop, and reload on SIGHUP or
``POST /v1/admin/reload``.

At startup the store is pinged until it answers or ``store_wait`` seconds pass; then the
service exits with a ``ConfigError`` naming the store's address (never its password), or,
with ``start_degraded``, logs it at ERROR and serves anyway: decisions fail open and
``/healthz`` answers 503 until the store does.

Connections: HTTP connections are timed at every stage (head, body, idle, a client not
reading) and at most ``max_connections`` are open (``http.server``); gRPC connections are
closed after 5 idle minutes and pinged when quiet so dead peers are dropped
(``GRPC_OPTIONS``).

Signals (``serve``): SIGHUP is ignored until the service serves, then reloads; SIGTERM and
SIGINT stop it: it stops accepting, finishes the requests and calls it has received (up to
``DRAIN`` seconds) and exits 0. Under a supervisor a worker also writes a heartbeat to a
pipe from its event loop (``lifecycle``).

A reload reads the config files again in a thread (the event loop keeps serving) and swaps
the new config in at once; if they are invalid the running config stays, the error is
logged and returned (and counted in ``ratekeeper_config_reloads_total``); either way its
duration is logged. Asks that come while a reload runs share the next one. A reload keeps
the store (its counters) but not a change of store: that needs a restart, and a reload that
asks for one is refused as an error. A directory given as ``--config`` is watched, as
envoyproxy/ratelimit's runtime directory is: a file written, created or removed in it (or the
directory's symlink swapped) reloads within ``watch_interval`` seconds (``watch.py``).
"""

from __future__ import annotations

import asyncio
import functools
import gc
import logging
import os
import signal
import socket
import sys
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import grpc

from ..clock import Clock
from ..errors import ConfigError, StoreUnavailable
from ..limiter import AsyncLimiter
from ..overload.concurrency import AsyncConcurrencyLimiter
from ..stores.base import AsyncPingable, AsyncStore, LocalStore
from ..stores.leases import AsyncLeaseStore
from ..stores.memory import MemoryStore
from ..stores.redis.batching import Batching
from ..stores.redis.cluster import RedisClusterStore
from ..stores.redis.layout import CompactLayout
from ..stores.redis.sentinel import SentinelShard
from ..stores.redis.sharded import SentinelStore, Shard, ShardedRedisStore
from ..stores.redis.single import RedisStore
from .config import loader as config_mod
from .config.watch import watch
from .engine import Engine
from .envoy.rlqs import wire as rlqs_wire
from .envoy.rlqs.hub import Quotas
from .envoy.rlqs.state import quota_state
from .envoy.rls import Envoy
from .envoy.servicer import RateLimitServicer, ThreadServicer, handler, on_loop, run_inline
from .grpc_port import add_grpc_port
from .http.api import HttpApi
from .http.guard import BrowserRules, is_loopback
from .http.server import HttpServer, HttpSettings, default_max_connections
from .lifecycle import heartbeat, ignore_hangups, on_signal
from .metrics import (
    BatchMetrics,
    InstrumentedLeases,
    InstrumentedLocalStore,
    InstrumentedPartitionedStore,
    InstrumentedStore,
    Metrics,
)
from .reloads import Coalesced

log = logging.getLogger("ratekeeper.service")
HEALTH_KEY = "ratekeeper:healthz"
"""The key ``/healthz`` peeks at (outside every policy's namespace: those start with a length)."""


SWITCH_INTERVAL = 0.001
"""Seconds a Python thread may hold the GIL while another waits for it (Python's default: 0.005).
gRPC's own threads hand every call to the handler (the event loop or a handler thread) and
back, each handing waiting on the GIL: at 1 ms the empty handler's p99 on handler threads
halved and ``grpc.aio``'s throughput rose (docs/contributing.md, "The service's stacks")."""
GRPC_MAX_CALLS = 1024
DRAIN = 5.0
"""Seconds a stopping service gives the HTTP requests and gRPC calls it has received."""
"""Calls a gRPC server holds at once (running or waiting for a thread or the loop); past it
a call is refused at once with RESOURCE_EXHAUSTED, so a stalled store or loop cannot pile up
calls without bound (Envoy applies its failure mode to the refusal)."""


@dataclass(frozen=True, slots=True)
class ServeOptions:
    """Where to listen and what to read."""

    config_files: tuple[str, ...] = ()
    host: str = "127.0.0.1"
    port: int = 8080
    grpc_port: int | None = 8081
    """None: no gRPC listener."""
    dotfiles: bool = False
    """Read dot files in config directories too (envoyproxy/ratelimit's default)."""
    watch_interval: float = 1.0
    """Seconds between looks at config directories for changes (0: do not watch)."""
    worker: int | None = None
    """This process's index under ``--workers`` (None: the only process): its ports are
    shared (SO_REUSEPORT), its metrics carry ``worker="<i>"`` and are published to
    ``metrics_dir`` for the other workers to include."""
    metrics_dir: str | None = None
    store_wait: float = 5.0
    """Seconds to wait at startup for the store to answer (0: one try)."""
    start_degraded: bool = False
    """Serve even if the store never answered (fail open, ``/healthz`` 503)."""
    header_timeout: float = 10.0
    """Seconds an HTTP connection may take to send a request's head (``HttpSettings``)."""
    body_timeout: float = 10.0
    idle_timeout: float = 5.0
    send_timeout: float = 10.0
    max_connections: int | None = None
    """Most open HTTP connections (None: the file-descriptor limit less a reserve)."""
    grpc_threads: int = 0
    """Handler threads of the standard ``grpc.server`` (0: ``grpc.aio`` on the event loop)."""
    allowed_hosts: tuple[str, ...] = ()
    """Host names served besides the listen address's (``http.guard``; ``*``: any)."""
    allowed_origins: tuple[str, ...] = ()
    """Origins allowed to send state-changing requests besides the service's own."""
    auth_warning: bool = True
    """Warn at startup when listening beyond loopback without tokens."""
    worker_timeout: float = 10.0
    """Under ``--workers``: seconds without a worker's heartbeat before it is replaced."""
    heartbeat_fd: int | None = None
    """A worker's end of its heartbeat pipe (set by the supervisor)."""


GRPC_IDLE_MS = 300_000
"""A gRPC connection without calls for 5 minutes is closed (Envoy reconnects on demand)."""
GRPC_KEEPALIVE_MS = 60_000
"""The server pings a connection quiet for a minute, and drops it if no answer comes in 20 s:
a client that vanished without closing (a dead host) does not hold its connection forever."""


GRPC_OPTIONS = (
    ("grpc.so_reuseport", 0),
    ("grpc.max_connection_idle_ms", GRPC_IDLE_MS),
    ("grpc.keepalive_time_ms", GRPC_KEEPALIVE_MS),
    ("grpc.keepalive_timeout_ms", 20_000),
)
"""gRPC server settings: no SO_REUSEPORT (a second service on the port must fail, not share
it), idle close and keepalive (see the constants above)."""


def grpc_options(shared: bool) -> tuple[tuple[str, int], ...]:
    """``GRPC_OPTIONS``, with SO_REUSEPORT for a worker (its supervisor holds the port)."""
    if not shared:
        return GRPC_OPTIONS
    return (("grpc.so_reuseport", 1), *(o for o in GRPC_OPTIONS if o[0] != "grpc.so_reuseport"))


def build_store(
    settings: config_mod.StoreSettings, metrics: Metrics
) -> tuple[AsyncStore, AsyncLeaseStore, object]:
    """The store a config asks for, instrumented, the same store's leases for concurrency
    policies, and the store itself (for ``ping``). A Redis store batches (plans and leases
    alike) unless told not to: its batches feed the latency and error metrics; without
    batching each call is timed on its own."""
    s = settings
    if s.kind == "memory":
        memory = MemoryStore(max_keys=s.max_keys)
        return InstrumentedLocalStore(memory, metrics), InstrumentedLeases(memory, metrics), memory
    batching = (
        Batching(
            s.batch_max_size,
            s.batch_max_wait_ms / 1000,
            BatchMetrics(metrics),
            s.batch_max_in_flight,
        )
        if s.batch
        else None
    )
    store: RedisStore | ShardedRedisStore | RedisClusterStore
    prefix, timeout = s.prefix, s.socket_timeout
    layout = CompactLayout(s.layout_buckets) if s.layout_buckets else None
    if s.kind == "redis":
        store = RedisStore(
            s.url, prefix=prefix, socket_timeout=timeout, batching=batching, layout=layout
        )
    elif s.kind == "sharded":
        shards = [
            SentinelShard(x.service, x.sentinels, x.url, x.name)
            if x.sentinels
            else Shard(x.url, x.replicas, x.name)
            for x in s.shards
        ]
        store = ShardedRedisStore(
            shards, prefix=prefix, socket_timeout=timeout, batching=batching, layout=layout
        )
    elif s.kind == "sentinel":
        (x,) = s.shards
        store = SentinelStore(
            x.service, x.sentinels, url=x.url, prefix=prefix, socket_timeout=timeout,
            batching=batching, layout=layout,
        )  # fmt: skip
    elif s.kind == "cluster":
        store = RedisClusterStore(
            s.url, prefix=prefix, socket_timeout=timeout, batching=batching, layout=layout
        )
    else:
        raise ConfigError(f"store kind {s.kind!r} is unknown")
    if s.batch:
        return store, store, store
    leases = InstrumentedLeases(store, metrics)
    if isinstance(store, ShardedRedisStore):
        return InstrumentedPartitionedStore(store, metrics), leases, store
    return InstrumentedStore(store, metrics), leases, store


class Service:
    """One running service: config, engine and the reload logic."""

    def __init__(self, options: ServeOptions, clock: Clock = time.time) -> None:
        self.options = options
        self.config = config_mod.load(options.config_files, dotfiles=options.dotfiles)
        _warn(self.config)
        self.metrics = Metrics(options.worker, options.metrics_dir)
        self.metrics.policies.set(len(self.config.policies))
        self.metrics.envoy.configure(
            self.config.envoy.near_limit_ratio, self.config.envoy.max_stat_keys
        )
        self.store, self.leases, self._raw_store = build_store(self.config.store, self.metrics)
        limiter = AsyncLimiter(self.store, clock=clock)
        # capacity and lease TTL come with each acquire, from the concurrency policy
        leases = AsyncConcurrencyLimiter(self.leases, capacity=1, clock=clock)
        kind = self.config.store.kind
        self.metrics.watch_breakers(limiter.breaker_states, kind, "rate")
        self.metrics.watch_breakers(leases.breaker_states, kind, "lease")
        self.engine = Engine(self.config, limiter, self.metrics, clock, leases)
        self.envoy = Envoy(self.engine, self.metrics.envoy)
        if options.grpc_threads and self.config.rlqs.rules:
            raise ConfigError(
                "rlqs: Envoy's quota streams are served by grpc.aio (the default); with "
                "--grpc-threads each stream would hold a handler thread: drop --grpc-threads"
            )
        self.quotas = Quotas(self.engine, quota_state(self._raw_store), self.metrics.rlqs, clock)
        self.reload = Coalesced(self._reload)
        """Re-read the config files (in a thread: requests go on being answered) and swap
        the new config in; on error keep the running config and return why. Asks made
        while a reload runs share the next one (``reloads``)."""
        rules = BrowserRules.for_listen(
            options.host, options.allowed_hosts, options.allowed_origins
        )
        self.api = HttpApi(self.engine, self.reload, self.health, rules)
        self._chores: set[asyncio.Task[Any]] = set()
        self._open_warned = False

    async def _reload(self) -> str | None:
        started = time.monotonic()
        options = self.options
        load = functools.partial(config_mod.load, options.config_files, dotfiles=options.dotfiles)
        try:
            new = await asyncio.get_running_loop().run_in_executor(None, load)
            if new.store != self.config.store:
                raise ConfigError("the store changed; a new store needs a restart")
        except ConfigError as exc:
            self.metrics.reloads.labels("error").inc()
            log.error(
                "config reload failed in %.2f s, keeping the running config: %s",
                time.monotonic() - started, exc,
            )  # fmt: skip
            return str(exc)
        self.config = new  # the swap: no await from here on
        self.engine.swap(new)
        self.metrics.envoy.configure(new.envoy.near_limit_ratio, new.envoy.max_stat_keys)
        self.metrics.reloads.labels("ok").inc()
        self.metrics.policies.set(len(new.policies))
        _warn(new)
        log.info(
            "config reloaded from %s in %.2f s", ", ".join(new.files), time.monotonic() - started
        )
        self.warn_if_open()
        return None

    def reload_soon(self) -> None:
        """SIGHUP's handler: a reload (coalesced with any running one)."""
        self._chore(self.reload())

    def _chore(self, coroutine: Any) -> None:
        task = asyncio.get_running_loop().create_task(coroutine)
        self._chores.add(task)
        task.add_done_callback(self._chores.discard)

    def open_to_network(self) -> bool:
        """Whether the service listens beyond this machine with no token configured: then
        anyone who reaches it may reset counters, reload and flip kill switches."""
        auth = self.config.auth
        return not is_loopback(self.options.host) and not (auth.token or auth.admin_token)

    def warn_if_open(self) -> None:
        """Log ``open_to_network`` once it holds (unless ``auth_warning`` is off)."""
        is_open = self.open_to_network()
        if is_open and not self._open_warned and self.options.auth_warning:
            log.warning(
                "listening on %s without tokens: anyone who can reach it may reset counters, "
                "reload the config and flip kill switches. Set RATEKEEPER_TOKEN and "
                "RATEKEEPER_ADMIN_TOKEN (or auth: in the config), or pass --no-auth-warning",
                self.options.host,
            )
        self._open_warned = is_open

    async def check_store(self) -> str | None:
        """Ping the store until it answers or ``store_wait`` passes; None, or why not."""
        store = self._raw_store  # the store itself, under any metrics wrapper
        if not isinstance(store, AsyncPingable):
            return None
        deadline = time.monotonic() + self.options.store_wait
        while True:
            try:
                await store.ping_async()
                return None
            except StoreUnavailable as exc:
                if time.monotonic() >= deadline:
                    return str(exc)
            await asyncio.sleep(0.25)

    async def health(self) -> dict[str, Any]:
        """Store reachability (a real read-only call) and the limiter's failure counters."""
        limiter = self.engine.limiter
        probe = await limiter.peek(HEALTH_KEY, "1/second")
        stats = limiter.stats()
        store_ok = not probe.degraded
        return {
            "store": "ok" if store_ok else "unavailable",
            "store_kind": self.config.store.kind,
            "degraded_decisions": stats["degraded"],
            "store_errors": stats["store_errors"],
            "breaker": stats["breaker"],
            "policies": len(self.config.policies),
            "open_to_network": self.open_to_network(),
        }

    async def run(
        self,
        stop: asyncio.Event | None = None,
        ready: asyncio.Event | None = None,
        freeze: bool = False,
    ) -> None:
        """Serve until ``stop`` is set (``serve`` sets it on SIGTERM and SIGINT), then drain:
        stop accepting, finish what was received (up to ``DRAIN`` seconds). ``freeze``: the
        heap too once serving (``freeze_heap``: the serving process does; a test serving in
        its own process leaves its heap alone)."""
        opts = self.options
        loop = asyncio.get_running_loop()
        stop = stop if stop is not None else asyncio.Event()
        shared = opts.worker is not None
        sock = _listen(opts.host, opts.port, shared)  # first, so a busy port fails cleanly
        grpc_server = None
        grpc_port = None
        if opts.grpc_port is not None:
            grpc_server = self.grpc_server(loop)
            try:
                grpc_port = add_grpc_port(
                    grpc_server.add_insecure_port, opts.host, opts.grpc_port, shared
                )
            except ConfigError:
                sock.close()
                raise
            await grpc_server.start()
        http = HttpServer(self.api, http_settings(opts), self.api)
        await http.start(sock)
        if opts.watch_interval > 0 and any(os.path.isdir(p) for p in opts.config_files):
            self._chore(watch(opts.config_files, opts.dotfiles, opts.watch_interval, self.reload))
        if shared:
            self._chore(self._publish())
        if grpc_server is not None and not opts.grpc_threads:
            self._chore(self.quotas.watch())
        if opts.heartbeat_fd is not None:
            self._chore(heartbeat(opts.heartbeat_fd))
        if freeze:  # before the banner: a process announced as serving has done it
            freeze_heap()
        # SIGHUP reloads from now on (ignored until now); before the banner, which tells a
        # supervisor that SIGHUP may be forwarded
        hangup = on_signal(loop, signal.SIGHUP, self.reload_soon)
        where = f"ratekeeper serving HTTP on http://{opts.host}:{http.port}"
        if grpc_port is not None:
            served = "Envoy RLS" if opts.grpc_threads else "Envoy RLS and RLQS"  # grpc_server
            where += f" and gRPC ({served}) on {opts.host}:{grpc_port}"
        worker = "" if opts.worker is None else f" [worker {opts.worker}]"
        print(where, f"[store: {self.config.store.kind}]{worker}", flush=True)
        print("config: " + ", ".join(self.config.files), flush=True)
        self.warn_if_open()
        if ready is not None:
            ready.set()
        try:
            await stop.wait()
        finally:
            if hangup:
                loop.remove_signal_handler(signal.SIGHUP)
                signal.signal(signal.SIGHUP, signal.SIG_IGN)  # stopping: a reload is moot
            for chore in list(self._chores):
                chore.cancel()
            drains = [http.shutdown(DRAIN)]
            if grpc_server is not None:
                await self.quotas.close()  # Envoys keep their shares while it is away
                drains.append(grpc_server.stop(grace=DRAIN))
            await asyncio.gather(*drains)

    def grpc_server(self, loop: asyncio.AbstractEventLoop) -> GrpcServer:
        """The gRPC server ``grpc_threads`` asks for, serving ShouldRateLimit (and, on
        ``grpc.aio``, the quota service's streams).

        ``grpc.aio`` on the event loop by default, on every store: beside the standard server's
        handler threads it measured faster (with ``SWITCH_INTERVAL``) and its tail shorter
        (docs/service.md, "Measured"). With threads, an in-process store's decision is made
        in the handler thread; a network store's is handed to the loop, where batching lives."""
        shared = self.options.worker is not None
        in_process = isinstance(self.store, LocalStore)
        threads = self.options.grpc_threads
        if not threads:
            aio = grpc.aio.server(
                options=grpc_options(shared), maximum_concurrent_rpcs=GRPC_MAX_CALLS
            )
            aio.add_generic_rpc_handlers(
                (
                    handler(RateLimitServicer(self.envoy)),
                    rlqs_wire.handler(rlqs_wire.QuotaServicer(self.quotas)),
                )
            )
            return GrpcServer(aio)
        servicer = ThreadServicer(self.envoy, run_inline if in_process else on_loop(loop))
        pool = ThreadPoolExecutor(threads, thread_name_prefix="ratekeeper-grpc")
        server = grpc.server(
            pool, options=grpc_options(shared), maximum_concurrent_rpcs=GRPC_MAX_CALLS
        )
        server.add_generic_rpc_handlers((handler(servicer),))
        return GrpcServer(server, pool)

    async def _publish(self) -> None:
        """A worker's chore: publish its metrics every second for the other workers, and stop
        when its supervisor is gone (its parent changed)."""
        parent = os.getppid()
        while True:
            self.metrics.publish()
            await asyncio.sleep(1.0)
            if os.getppid() != parent:
                log.error("the supervisor is gone; worker %s stops", self.options.worker)
                signal.raise_signal(signal.SIGTERM)


class GrpcServer:
    """``grpc.aio``'s server or the standard one (with its pool) behind ``grpc.aio``'s
    start/stop coroutines."""

    def __init__(self, server: Any, pool: ThreadPoolExecutor | None = None) -> None:
        self.server, self.pool = server, pool

    def add_insecure_port(self, where: str) -> int:
        return int(self.server.add_insecure_port(where))

    async def start(self) -> None:
        if self.pool is None:
            await self.server.start()
        else:
            self.server.start()

    async def stop(self, grace: float) -> None:
        """Finish the calls in progress (up to ``grace`` seconds) with the event loop still
        running: a handler thread may be waiting for it."""
        if self.pool is None:
            await self.server.stop(grace=grace)
            return
        done = self.server.stop(grace)
        await asyncio.get_running_loop().run_in_executor(None, done.wait)
        self.pool.shutdown(wait=False)


def http_settings(options: ServeOptions) -> HttpSettings:
    """The HTTP server's limits (also the benchmark's ceilings')."""
    return HttpSettings(
        header_timeout=options.header_timeout,
        body_timeout=options.body_timeout,
        idle_timeout=options.idle_timeout,
        send_timeout=options.send_timeout,
        max_connections=options.max_connections or default_max_connections(),
    )


def _warn(config: config_mod.ServiceConfig) -> None:
    for warning in config.warnings:
        log.warning("config: %s", warning)


def _listen(host: str, port: int, shared: bool = False) -> socket.socket:
    """The HTTP listening socket, or a ``ConfigError`` naming the address (e.g. port in use);
    ``shared``: with SO_REUSEPORT, as every worker of a supervisor listens."""
    try:
        family, kind, proto, _, address = socket.getaddrinfo(
            host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE
        )[0]
        sock = socket.socket(family, kind, proto)
    except OSError as exc:
        raise ConfigError(f"cannot listen for HTTP on {host}:{port} (--host): {exc}") from None
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        if shared:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
        sock.bind(address)
        sock.listen(2048)
        sock.setblocking(False)
    except OSError as exc:
        sock.close()
        raise ConfigError(
            f"cannot listen for HTTP on {host}:{port} (--port): {exc.strerror or exc}"
        ) from None
    return sock


def serve(options: ServeOptions) -> int:
    """Build and run the service (on uvloop when installed); return the process exit code:
    0 once stopped by SIGTERM or SIGINT (at any time, startup included), 2 for a config
    error, a port in use or a store that did not answer."""
    worker = "" if options.worker is None else f"[worker {options.worker}] "
    ignore_hangups()
    tune_process()
    logging.basicConfig(
        level=logging.WARNING, format=f"%(asctime)s %(levelname)s {worker}%(message)s"
    )

    async def main() -> None:
        loop = asyncio.get_running_loop()
        stop = asyncio.Event()
        for sig in (signal.SIGTERM, signal.SIGINT):
            on_signal(loop, sig, stop.set)
        service = Service(options)
        checked = asyncio.ensure_future(service.check_store())
        stopped = asyncio.ensure_future(stop.wait())
        await asyncio.wait((checked, stopped), return_when=asyncio.FIRST_COMPLETED)
        stopped.cancel()
        if stop.is_set():
            checked.cancel()
            return
        error = checked.result()
        if error is not None:
            if not options.start_degraded:
                raise ConfigError(
                    f"the store does not answer: {error}. Check store: in the config, or pass "
                    "--start-degraded to serve anyway (decisions fail open, /healthz 503)"
                )
            log.error("the store does not answer (%s); serving degraded: fail open", error)
        await service.run(stop, freeze=True)

    try:
        with asyncio.Runner(loop_factory=_loop_factory()) as runner:
            runner.run(main())
    except ConfigError as exc:
        print(f"ratekeeper serve: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 0
    return 0


def tune_process() -> None:
    """Process settings of a serving process (``serve`` and the benchmark's ceilings)."""
    sys.setswitchinterval(SWITCH_INTERVAL)


def freeze_heap() -> None:
    """Move what startup made (modules, protobuf descriptors, the config) out of the cyclic
    garbage collector's reach, once serving has begun: a full collection then scans only
    what serving made since, instead of pausing every request for tens of milliseconds."""
    gc.collect()
    gc.freeze()


def _loop_factory() -> Callable[[], asyncio.AbstractEventLoop] | None:
    try:
        import uvloop
    except ImportError:
        return None
    factory: Callable[[], asyncio.AbstractEventLoop] = uvloop.new_event_loop
    return factory
