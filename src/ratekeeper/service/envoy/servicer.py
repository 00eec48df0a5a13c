"""Envoy's rate limit service over gRPC: ``envoy.service.ratelimit.v3.RateLimitService/
ShouldRateLimit``, with Envoy's own messages (the ``xds-protos`` package, generated from
envoyproxy/data-plane-api; imported only here, so ``import ratekeeper`` stays free of it).

This module is the wire: it checks the token, turns a ``RateLimitRequest`` into
``rls.Descriptor``s, asks ``rls.Envoy`` and builds the ``RateLimitResponse``. Before
anything is counted it refuses, with ``INVALID_ARGUMENT`` and nothing charged: an empty
domain or descriptor list, more than ``envoy.max_descriptors`` descriptors or
``envoy.max_entries`` entries in one request, a ``hits_addend`` over 2**31-1, a limit
override with unit ``UNKNOWN``, a counter key over ``max_key_length``, and a request whose
answer could exceed ``MAX_REPLY_BYTES`` (its size is checked again once built).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
from collections.abc import Callable, Coroutine
from typing import Any, TypeVar

import grpc
from envoy.service.ratelimit.v3 import rls_pb2 as pb
from google.protobuf.message import DecodeError

from ...errors import BadRequest
from ..auth import check_bearer
from ..config.settings import AuthSettings
from .reply import ReplyEncoder
from .rls import Answer, Descriptor, Envoy, check_override_unit

SERVICE = "envoy.service.ratelimit.v3.RateLimitService"
MAX_HITS = 2**31 - 1
MAX_REPLY_BYTES = 4 * 1024 * 1024
"""gRPC's default largest message a client accepts."""
_STATUS_BYTES = 64
"""An upper bound on one status without its name: code, limit, remaining, duration."""
log = logging.getLogger("ratekeeper.service")
Response = pb.RateLimitResponse
T = TypeVar("T")


Parsed = tuple[str, tuple[Descriptor, ...], int]
"""A request as Envoy's logic takes it: domain, descriptors, the request's ``hits_addend``."""
MAX_PARSED = 10_000
"""Requests kept parsed by their bytes (callers choose the bytes, so it is bounded)."""
HOP_TIMEOUT = 30.0
"""Seconds a handler thread waits for the event loop's answer (a store call is bounded by
its ``socket_timeout`` long before this; past it the call is answered ``UNAVAILABLE``)."""


class Wire:
    """What both servers share: the token check, the request parsed and checked (cached by
    its bytes: Envoy sends the same bytes for the same descriptors), the reply encoded."""

    def __init__(self, envoy: Envoy) -> None:
        self.envoy = envoy
        self._parsed: tuple[int, dict[bytes, Parsed]] = (envoy.engine.generation, {})
        """Parsed requests, with the engine generation (so the caps) they were checked by."""
        self._encoder = ReplyEncoder()

    def authorized(self, metadata: Any) -> bool:
        """Whether ``metadata`` carries the client or the admin token (as HTTP's client
        routes require); only asked when ``auth.grpc`` is set."""
        return authorized(self.envoy.engine.config.auth, metadata)

    def parse(self, raw: bytes) -> Parsed:
        """The request in ``raw``, checked (``BadRequest`` before anything is counted)."""
        engine = self.envoy.engine
        generation = engine.generation  # before the config: a reload swaps the config first
        cached, table = self._parsed
        if generation != cached:  # the caps may have changed
            if generation > cached:
                self._parsed = (generation, {})
            table = {}  # a reload happened: this request's parse is kept by no table
        parsed = table.get(raw)
        if parsed is None:
            try:
                request = pb.RateLimitRequest.FromString(raw)
            except DecodeError:
                raise BadRequest(
                    "request", f"{len(raw)} bytes that are not a RateLimitRequest"
                ) from None
            settings = engine.config.envoy
            descriptors = descriptors_of(request, settings.max_descriptors, settings.max_entries)
            hits = request.hits_addend
            if hits > MAX_HITS:
                raise BadRequest("hits_addend", f"hits_addend {hits} is over {MAX_HITS}")
            metadata = settings.response_dynamic_metadata
            if len(descriptors) > 1 or metadata:  # one status alone is far below the bound
                check_reply_size(request, metadata)
            parsed = (request.domain, tuple(descriptors), hits)
            if len(table) >= MAX_PARSED:
                table.clear()
            table[raw] = parsed
        return parsed

    def refused(self, exc: BadRequest) -> str:
        """Count a refused request; the ``INVALID_ARGUMENT`` message."""
        self.envoy.engine.metrics.refused.labels(exc.field).inc()
        return f"{exc.field}: {exc}"

    def reply(self, answer: Answer) -> bytes:
        """The serialized ``RateLimitResponse``."""
        return self._encoder.encode(answer)


def authorized(auth: AuthSettings, metadata: Any) -> bool:
    """Whether gRPC ``metadata`` carries the client or the admin token (``auth.grpc``: the
    rate limit and the quota services alike)."""
    given = dict(metadata or ()).get("authorization", "")
    scheme, _, token = str(given).partition(" ")
    token = token.strip() if scheme.lower() == "bearer" else ""
    return bool(
        (auth.token and check_bearer(token, auth.token))
        or (auth.admin_token and check_bearer(token, auth.admin_token))
    )


def too_large(reply: bytes) -> str | None:
    """Why a reply cannot be sent (charged already: say so rather than send what fails)."""
    if len(reply) <= MAX_REPLY_BYTES:
        return None
    log.error("ShouldRateLimit reply of %d bytes is over %d", len(reply), MAX_REPLY_BYTES)
    return f"reply of {len(reply)} bytes is too large"


class RateLimitServicer:
    """Answers ShouldRateLimit on ``grpc.aio``: Envoy's logic runs on the event loop."""

    def __init__(self, envoy: Envoy) -> None:
        self.envoy = envoy
        self.wire = Wire(envoy)

    async def should_rate_limit(
        self, raw: bytes, context: grpc.aio.ServicerContext[Any, Any]
    ) -> bytes:
        wire = self.wire
        if self.envoy.engine.config.auth.grpc and not wire.authorized(
            context.invocation_metadata()
        ):
            await context.abort(grpc.StatusCode.UNAUTHENTICATED, "missing or wrong token")
        try:
            answer = await self.envoy.should_rate_limit(*wire.parse(raw))
        except BadRequest as exc:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, wire.refused(exc))
        reply = wire.reply(answer)
        if len(reply) > MAX_REPLY_BYTES:
            await context.abort(grpc.StatusCode.RESOURCE_EXHAUSTED, too_large(reply) or "")
        return reply


class ThreadServicer:
    """Answers ShouldRateLimit on the standard ``grpc.server``, in its handler threads.

    Envoy's logic is the same coroutine; ``run`` carries it out: to its end in the handler
    thread when the store is in-process (``run_inline``: nothing in it waits for I/O), else
    on the event loop, where the store's batching lives (``on_loop``)."""

    def __init__(self, envoy: Envoy, run: Callable[[Coroutine[Any, Any, Answer]], Answer]) -> None:
        self.envoy = envoy
        self.wire = Wire(envoy)
        self.run = run

    def should_rate_limit(self, raw: bytes, context: grpc.ServicerContext) -> bytes:
        wire = self.wire
        if self.envoy.engine.config.auth.grpc and not wire.authorized(
            context.invocation_metadata()
        ):
            context.abort(grpc.StatusCode.UNAUTHENTICATED, "missing or wrong token")
        try:
            answer = self.run(self.envoy.should_rate_limit(*wire.parse(raw)))
        except BadRequest as exc:
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, wire.refused(exc))
        except TimeoutError:
            context.abort(grpc.StatusCode.UNAVAILABLE, f"no decision within {HOP_TIMEOUT} s")
        reply = wire.reply(answer)
        if len(reply) > MAX_REPLY_BYTES:
            context.abort(grpc.StatusCode.RESOURCE_EXHAUSTED, too_large(reply) or "")
        return reply


def run_inline(coro: Coroutine[Any, Any, T]) -> T:
    """Carry a coroutine that never waits for I/O to its end in this thread (it may yield
    bare, as ``asyncio.sleep(0)`` does); one that awaits a future is a bug, refused."""
    try:
        while True:
            if coro.send(None) is not None:
                coro.close()
                raise RuntimeError("an in-process decision awaited I/O; it must not")
    except StopIteration as done:
        return done.value  # type: ignore[no-any-return]


def on_loop(loop: asyncio.AbstractEventLoop) -> Callable[[Coroutine[Any, Any, T]], T]:
    """A ``run`` that hands the coroutine to ``loop`` and waits for its answer (at most
    ``HOP_TIMEOUT`` seconds: then it is cancelled and ``TimeoutError`` raised)."""

    def run(coro: Coroutine[Any, Any, T]) -> T:
        future = asyncio.run_coroutine_threadsafe(coro, loop)
        try:
            return future.result(HOP_TIMEOUT)
        except concurrent.futures.TimeoutError:
            future.cancel()
            raise TimeoutError from None

    return run


def descriptors_of(request: Any, max_descriptors: int, max_entries: int) -> list[Descriptor]:
    """The request's descriptors, checked (see the module docstring)."""
    if not request.domain:
        raise BadRequest("domain", "domain is empty; every request must name its domain")
    count = len(request.descriptors)
    if not count:
        raise BadRequest("descriptors", "descriptors is empty; expected at least one")
    if count > max_descriptors:
        raise BadRequest(
            "descriptors",
            f"{count} descriptors in one request; the limit is {max_descriptors} "
            "(envoy.max_descriptors)",
        )
    descriptors = request.descriptors
    if count == 1:
        entries = len(descriptors[0].entries)
    else:
        entries = sum(len(d.entries) for d in descriptors)
    if entries > max_entries:
        raise BadRequest(
            "descriptors",
            f"{entries} descriptor entries in one request; the limit is {max_entries} "
            "(envoy.max_entries)",
        )
    out = []
    for i, d in enumerate(descriptors):
        pairs = tuple([(e.key, e.value) for e in d.entries])
        if len(d.ListFields()) <= 1:  # entries only (or nothing): Envoy's usual descriptor
            out.append(Descriptor(pairs))
            continue
        hits = None
        if d.HasField("hits_addend"):
            hits = d.hits_addend.value
            if hits > MAX_HITS:
                raise BadRequest(
                    "descriptors", f"descriptor {i} hits_addend {hits} is over {MAX_HITS}"
                )
        limit = None
        if d.HasField("limit"):
            check_override_unit(i, d.limit.unit)
            limit = (d.limit.requests_per_unit, d.limit.unit)
        out.append(Descriptor(pairs, hits, limit))
    return out


def check_reply_size(request: Any, dynamic_metadata: bool) -> None:
    """Refuse, before anything is counted, a request whose reply could be too large: the
    statuses and their names are bounded by the config, the echoed metadata by the request."""
    bound = len(request.descriptors) * (_STATUS_BYTES + 1024)
    if dynamic_metadata:
        bound += 2 * request.ByteSize()
    if bound > MAX_REPLY_BYTES:
        raise BadRequest(
            "descriptors", f"the reply to this request could exceed {MAX_REPLY_BYTES} bytes"
        )


def handler(
    servicer: RateLimitServicer | ThreadServicer,
) -> grpc.GenericRpcHandler[Any, Any]:
    """The generic handler to add to a server (bytes in, bytes out: ``Wire`` parses and
    encodes)."""
    method = grpc.unary_unary_rpc_method_handler(servicer.should_rate_limit)
    return grpc.method_handlers_generic_handler(SERVICE, {"ShouldRateLimit": method})
