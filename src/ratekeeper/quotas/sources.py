"""Plan sources: where a tenant's plan and overrides come from.

A source answers ``lookup(tenant) -> TenantPlan | None`` (``None``: a tenant it does not know,
which gets the default plan). ``Quotas`` caches the answers (``quotas.cache``) and checks them
against the plans, so a source only fetches and parses.

- ``StaticSource``: tenants in a dict, in process; writable (the plans file's ``customers``,
  or the admin's overrides when the main source is read-only).
- ``FunctionSource``: your function (a database lookup): it returns ``None``, a plan name, a
  ``TenantPlan`` or ``{"plan": ..., "overrides": {limit: {"rate": ..., "until": ...}}}``; a
  coroutine function serves ``AsyncLimiter`` without blocking its loop. Read-only.
- ``RedisSource``: one hash per tenant, ``{prefix}{tenant}`` with fields ``plan`` and
  ``override:<limit>`` (an override as JSON); writable, and every write publishes the tenant on
  ``channel`` so that every process's cache drops it at once (``listen``). Shared by every
  process on the same Redis; ``HSET ratekeeper:plans:acme plan pro`` plus a ``PUBLISH`` of
  ``t:acme`` is the same change by hand.

Capabilities are small protocols, checked once by ``Quotas``: ``AsyncSource``
(``lookup_async``), ``WritableSource`` (``set_plan``, ``set_override``), ``ListeningSource``
(``listen``).
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import logging
import threading
from collections.abc import Awaitable, Callable, Mapping
from typing import Any, Protocol, runtime_checkable

from ..errors import ConfigError, StoreUnavailable
from ..stores.loops import PerLoop
from ..stores.redis.keys import encode_tag
from .overrides import Override, TenantPlan

log = logging.getLogger("ratekeeper")

Answer = TenantPlan | str | Mapping[str, Any] | None
"""What a ``FunctionSource``'s function may return."""


@runtime_checkable
class Source(Protocol):
    """Answers which plan a tenant is on."""

    def lookup(self, tenant: str) -> TenantPlan | None:
        """The tenant's plan and overrides, or None for a tenant this source does not know."""
        ...


@runtime_checkable
class AsyncSource(Protocol):
    """A source that can answer without blocking an event loop."""

    async def lookup_async(self, tenant: str) -> TenantPlan | None:
        """See ``Source.lookup``."""
        ...


@runtime_checkable
class WritableSource(Protocol):
    """A source the admin operations can change."""

    def set_plan(self, tenant: str, plan: str | None) -> None:
        """Put ``tenant`` on ``plan`` (None: back to the default)."""
        ...

    def set_override(self, tenant: str, name: str, override: Override | None) -> None:
        """Set (or with None remove) the tenant's override of limit ``name``."""
        ...


@runtime_checkable
class ListeningSource(Protocol):
    """A source that tells when a tenant changed (``None``: anything may have changed)."""

    def listen(self, changed: Callable[[str | None], None]) -> Callable[[], None]:
        """Call ``changed`` for every change until the returned function is called."""
        ...


def coerce(answer: object) -> TenantPlan | None:
    """A source's answer as a ``TenantPlan`` (or None); ``ConfigError`` naming garbage."""
    if answer is None or isinstance(answer, TenantPlan):
        return answer
    if isinstance(answer, str):
        return TenantPlan(answer)
    if isinstance(answer, Mapping):
        unknown = sorted(str(k) for k in set(answer) - {"plan", "overrides"})
        if unknown:
            raise ConfigError(f"plan source answered an unknown field {unknown[0]!r}")
        raw = answer.get("overrides") or {}
        if not isinstance(raw, Mapping):
            raise ConfigError(f"plan source's overrides {str(raw)[:100]!r} must be a mapping")
        overrides = {
            str(name): body if isinstance(body, Override) else Override.from_dict(body)
            for name, body in raw.items()
        }
        plan = answer.get("plan")
        if plan is not None and not isinstance(plan, str):
            raise ConfigError(f"plan source answered plan {plan!r}, not a plan name")
        return TenantPlan(plan, overrides)
    raise ConfigError(
        f"plan source answered {str(answer)[:100]!r} ({type(answer).__name__}); expected None, "
        "a plan name, a TenantPlan or a mapping with 'plan' and 'overrides'"
    )


class StaticSource:
    """Tenants held in process (``customers``: tenant -> ``TenantPlan`` or plan name)."""

    def __init__(self, customers: Mapping[str, TenantPlan | str] | None = None) -> None:
        self._lock = threading.Lock()
        self._tenants: dict[str, TenantPlan] = {}
        for tenant, spec in (customers or {}).items():
            found = coerce(spec)
            if found is not None:
                self._tenants[str(tenant)] = found

    def __len__(self) -> int:
        return len(self._tenants)

    def lookup(self, tenant: str) -> TenantPlan | None:
        return self._tenants.get(tenant)

    def set_plan(self, tenant: str, plan: str | None) -> None:
        with self._lock:
            old = self._tenants.get(tenant, TenantPlan())
            self._tenants[tenant] = TenantPlan(plan, old.overrides)

    def set_override(self, tenant: str, name: str, override: Override | None) -> None:
        with self._lock:
            old = self._tenants.get(tenant, TenantPlan())
            overrides = dict(old.overrides)
            if override is None:
                overrides.pop(name, None)
            else:
                overrides[name] = override
            self._tenants[tenant] = TenantPlan(old.plan, overrides)


class FunctionSource:
    """Your function as a source: ``fn(tenant)`` returns what ``coerce`` accepts; a coroutine
    function is awaited by ``lookup_async`` (``lookup`` then refuses: use ``AsyncLimiter``)."""

    def __init__(self, fn: Callable[[str], Answer | Awaitable[Answer]]) -> None:
        if not callable(fn):
            raise ConfigError(f"plan source {fn!r} is not callable; expected fn(tenant)")
        self.fn = fn
        self.is_async = inspect.iscoroutinefunction(fn)

    def lookup(self, tenant: str) -> TenantPlan | None:
        if self.is_async:
            raise ConfigError("this plan source is a coroutine function; use it with AsyncLimiter")
        return coerce(self.fn(tenant))

    async def lookup_async(self, tenant: str) -> TenantPlan | None:
        answer = self.fn(tenant)
        if inspect.isawaitable(answer):
            answer = await answer
        return coerce(answer)


class RedisSource:
    """Tenants in Redis hashes ``{prefix}{tenant}`` (``plan``, ``override:<limit>``), with
    changes published on ``channel`` (see the module docstring).

    Give a ``url`` or the clients (a ``redis.Redis`` for ``lookup``, writes and ``listen``;
    a ``redis.asyncio.Redis``, or a function building one, for ``lookup_async``). As a
    store's, the asyncio client is kept per event loop (``stores.loops``): another loop gets
    a client of its own, built from the URL, the function or as a twin of the client given.
    A tenant's name is escaped in the key as a store key's is (``stores.keys.encode_tag``:
    braces, ``%``, long names hashed)."""

    def __init__(
        self,
        url: str | None = None,
        *,
        client: Any = None,
        async_client: Any = None,
        prefix: str = "ratekeeper:plans:",
        channel: str | None = None,
        socket_timeout: float = 0.5,
    ) -> None:
        if url is None and client is None and async_client is None:
            raise ConfigError("RedisSource needs a url (redis://host:port/db) or a client")
        if not isinstance(prefix, str) or not prefix or len(prefix) > 100:
            raise ConfigError(f"prefix {prefix!r} is invalid; expected 1-100 characters")
        self._async: PerLoop[Any] | None = None
        if url is not None:
            import redis
            import redis.asyncio

            options = {"socket_timeout": socket_timeout, "socket_connect_timeout": socket_timeout}
            client = client or redis.Redis.from_url(url, **options)
            if async_client is None:
                self._async = PerLoop(lambda: redis.asyncio.Redis.from_url(url, **options))  # type: ignore[arg-type]  # redis-py's kwargs
        if async_client is not None:
            self._async = _per_loop(async_client)
        self.client = client
        self.prefix = prefix
        self.channel = channel or f"{prefix}changed"

    @property
    def async_client(self) -> Any:
        """The asyncio client of the running event loop (outside one: of the last loop)."""
        return None if self._async is None else self._async.current()

    def key(self, tenant: str) -> str:
        """The Redis key of ``tenant``'s hash."""
        return self.prefix + encode_tag(tenant)

    def lookup(self, tenant: str) -> TenantPlan | None:
        if self.client is None:
            raise ConfigError("this RedisSource has only an async client; use AsyncLimiter")
        return parse_hash(self._call(self.client.hgetall, self.key(tenant)))

    async def lookup_async(self, tenant: str) -> TenantPlan | None:
        if self._async is None:
            return await asyncio.to_thread(self.lookup, tenant)
        try:
            raw = await self._async.get().hgetall(self.key(tenant))
        except Exception as exc:
            raise StoreUnavailable(f"plan source could not read {tenant!r}: {exc}") from exc
        return parse_hash(raw)

    def set_plan(self, tenant: str, plan: str | None) -> None:
        key = self.key(tenant)
        if plan is None:
            self._call(self.client.hdel, key, "plan")
        else:
            self._call(self.client.hset, key, "plan", plan)
        self.publish(tenant)

    def set_override(self, tenant: str, name: str, override: Override | None) -> None:
        key = self.key(tenant)
        if override is None:
            self._call(self.client.hdel, key, f"override:{name}")
        else:
            self._call(self.client.hset, key, f"override:{name}", override.to_json())
        self.publish(tenant)

    def publish(self, tenant: str | None) -> None:
        """Tell every listening process that ``tenant`` (None: every tenant) changed."""
        self._call(self.client.publish, self.channel, "*" if tenant is None else f"t:{tenant}")

    def _call(self, fn: Callable[..., Any], *args: Any) -> Any:
        if self.client is None:
            raise ConfigError("this RedisSource has only an async client; pass client= too")
        try:
            return fn(*args)
        except Exception as exc:
            raise StoreUnavailable(f"plan source on Redis failed: {exc}") from exc

    def listen(self, changed: Callable[[str | None], None]) -> Callable[[], None]:
        """A daemon thread subscribed to ``channel`` calls ``changed(tenant)`` per message;
        after a lost connection it calls ``changed(None)`` (messages may have been missed)
        and subscribes again. The returned function stops it."""
        stop = threading.Event()
        thread = threading.Thread(
            target=self._listen, args=(changed, stop), name="ratekeeper-plans", daemon=True
        )
        thread.start()

        def close() -> None:
            stop.set()
            thread.join(timeout=5)

        return close

    def _listen(self, changed: Callable[[str | None], None], stop: threading.Event) -> None:
        wait = 0.1
        while not stop.is_set():
            pubsub = None
            try:
                pubsub = self.client.pubsub(ignore_subscribe_messages=True)
                pubsub.subscribe(self.channel)
                changed(None)  # anything written before we listened (or while we were away)
                wait = 0.1
                while not stop.is_set():
                    message = pubsub.get_message(timeout=0.2)
                    if message is None:
                        continue
                    data = message.get("data")
                    text = data.decode("utf-8", "replace") if isinstance(data, bytes) else data
                    changed(text[2:] if isinstance(text, str) and text[:2] == "t:" else None)
            except Exception as exc:  # a lost connection: listen again, invalidate all
                log.warning("ratekeeper plan changes: %s; listening again in %.1f s", exc, wait)
                stop.wait(wait)
                wait = min(wait * 2, 5.0)
            finally:
                if pubsub is not None:
                    with contextlib.suppress(Exception):  # closing a broken connection
                        pubsub.close()


def _per_loop(async_client: Any) -> PerLoop[Any]:
    """Asyncio clients per event loop from a client (the first loop's; twins for the others)
    or a function building one (called once per loop)."""
    import redis.asyncio

    from ..stores.redis.single import twin_client

    if isinstance(async_client, redis.asyncio.Redis):
        return PerLoop(twin_client(async_client), async_client)
    if callable(async_client):
        return PerLoop(async_client)
    raise ConfigError(
        f"async_client={async_client!r} is invalid; expected a redis.asyncio.Redis or a "
        "function returning one"
    )


def parse_hash(raw: Mapping[Any, Any]) -> TenantPlan | None:
    """A tenant's hash (``plan``, ``override:<limit>``) as a ``TenantPlan``; None if empty."""
    if not raw:
        return None
    plan: str | None = None
    overrides: dict[str, Override] = {}
    for k, v in raw.items():
        key = k.decode("utf-8", "replace") if isinstance(k, bytes) else str(k)
        if key == "plan":
            plan = v.decode("utf-8", "replace") if isinstance(v, bytes) else str(v)
        elif key.startswith("override:"):
            overrides[key[9:]] = Override.from_json(v)
        else:
            raise ConfigError(f"plan source hash has an unknown field {key[:100]!r}")
    return TenantPlan(plan, overrides)
