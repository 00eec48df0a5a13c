"""``Gateway``: an ASGI reverse proxy for LLM APIs, with token and request limits nobody dodges.

One request's path (each step's rules are in its module):

1. the route names the API (``routes``: ``/v1/chat/completions`` -> ``chat``...); another
   path is a 404, another method a 405, in the API's error format;
2. ``identify(request)`` says who the caller is (``Caller``), from what the gateway checks
   (its API key), or None: 401;
3. the body (at most ``max_request_bytes``: else 413) is read and prepared
   (``estimate.Estimator``): the estimate, the body sent on (the most capped and written in,
   ``include_usage`` forced); a body the API would refuse is a 400, charged nothing;
4. one reservation of the estimate on every level (``limits``): refused, a 429 in the API's
   format with the headers its SDK reads (``headers``); the store unreachable: admitted,
   unmarked (fail open, as every limiter here);
5. the request goes to the upstream (``upstream.Upstream``); no answer, or a 5xx: cancelled,
   the 5xx passed on (a connect error or timeout: 502/504);
6. the body streams through as it comes, chunk by chunk, read by a meter on the way
   (``meters``); the client's disconnect is watched. When the client leaves, the gateway
   reads on to the usage (``on_disconnect="drain"``, for at most ``drain_timeout``) and
   charges it, or stops at once (``"close"``) and charges what was produced so far;
7. the reservation is settled with what ``settling.charge_of`` says, once, even when the app
   is cancelled.

Nothing the client or the upstream sends can raise out of here: a malformed stream, a usage
missing, invalid or given twice, a body past its bound, a stream that never ends — each is
logged (once per ``log_interval`` for each kind) and counted (``stats()``), and the estimate
stands. Once the response has started, a failure ends its body; before, it is a 502.
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import logging
import time
from collections import Counter
from collections.abc import Awaitable, Callable, Mapping, MutableMapping, Sequence
from dataclasses import replace
from typing import Any

from ..clock import Clock
from ..errors import ConfigError, StoreUnavailable
from ..limiter import AsyncLimiter
from ..middleware.request import RequestInfo, from_scope
from ..nested import Reservation
from ..stores.memory import MemoryStore
from .estimate import BadRequest, Estimator, Prepared, heuristic_tokens
from .headers import anthropic_headers, error_body, openai_headers
from .limits import Caller, Limit, Limits, tightest
from .meters import APIS, BodyMeter, Meter, StreamMeter
from .refusals import refusal
from .settling import Price, charge_of, total
from .upstream import Response, Upstream, UpstreamError

log = logging.getLogger("ratekeeper.llm")

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
Identify = Callable[[RequestInfo], "Caller | Awaitable[Caller | None] | None"]

ROUTES: Mapping[str, str] = {
    "/v1/chat/completions": "chat",
    "/v1/completions": "completions",
    "/v1/responses": "responses",
    "/v1/embeddings": "embeddings",
    "/v1/messages": "messages",
}
"""The default routes: OpenAI's four metered APIs and Anthropic's messages."""

MAX_REQUEST_BYTES = 32 << 20
DISCONNECTS = ("drain", "close")


def provider_of(api: str) -> str:
    """Whose formats an API speaks: ``anthropic`` for messages, else ``openai``."""
    return "anthropic" if api == "messages" else "openai"


class UpstreamBroken(Exception):
    """Raised to the server once a response is cut because its upstream broke mid-body, so the
    server drops the connection and the client sees a cut body, not a whole one."""


class Gateway:
    """The ASGI app (module docstring). ``limits`` and ``identify`` say who is limited how;
    ``store`` (default a new ``MemoryStore``; a ``RedisStore`` to share limits across
    processes) or ``limiter`` hold the counters; ``upstream`` is the provider's base URL
    (``upstream_headers`` carry its credentials)."""

    def __init__(
        self,
        upstream: str,
        limits: Sequence[Limit],
        identify: Identify,
        *,
        upstream_headers: Mapping[str, str] | None = None,
        store: Any = None,
        limiter: AsyncLimiter | None = None,
        clock: Clock = time.time,
        estimator: Estimator | None = None,
        price: Price = total,
        routes: Mapping[str, str] = ROUTES,
        on_disconnect: str = "drain",
        drain_timeout: float = 30.0,
        stream_timeout: float = 600.0,
        connect_timeout: float = 10.0,
        read_timeout: float = 120.0,
        max_request_bytes: int = MAX_REQUEST_BYTES,
        max_body_bytes: int = 8 << 20,
        max_event_bytes: int = 1 << 20,
        log_interval: float = 60.0,
        transport: Any = None,
    ) -> None:
        self.limits = Limits(limits)
        if not callable(identify):
            raise ValueError(f"identify={identify!r} is invalid; expected a function")
        for path, api in routes.items():
            if api not in APIS:
                raise ValueError(f"route {path!r}: api {api!r} is unknown; expected one of "
                                 f"{', '.join(APIS)}")  # fmt: skip
        if on_disconnect not in DISCONNECTS:
            raise ValueError(f"on_disconnect={on_disconnect!r} is invalid; expected 'drain' "
                             "or 'close'")  # fmt: skip
        for name, value in (("drain_timeout", drain_timeout), ("stream_timeout", stream_timeout),
                            ("connect_timeout", connect_timeout),
                            ("read_timeout", read_timeout)):  # fmt: skip
            if not isinstance(value, int | float) or not 0 < value <= 86_400:
                raise ValueError(f"{name}={value!r} is invalid; expected seconds, 0 to a day")
        self.identify = identify
        self.routes = dict(routes)
        self.limiter = limiter or AsyncLimiter(
            MemoryStore() if store is None else store, clock=clock, count_decisions=False
        )
        self.estimator = estimator or Estimator()
        self.price = price
        self.on_disconnect = on_disconnect
        self.drain_timeout = float(drain_timeout)
        self.stream_timeout = float(stream_timeout)
        self.ttl = min(86_400.0, self.stream_timeout + self.drain_timeout + 60.0)
        self.max_request_bytes = max_request_bytes
        self.max_body_bytes = max_body_bytes
        self.max_event_bytes = max_event_bytes
        self.log_interval = log_interval
        self.upstream = Upstream(upstream, upstream_headers, connect_timeout=connect_timeout,
                                 read_timeout=read_timeout, transport=transport)  # fmt: skip
        self.counts: Counter[str] = Counter()
        self.problems: Counter[str] = Counter()
        self._logged: dict[str, float] = {}

    # --- the ASGI app -------------------------------------------------------------------

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "lifespan":
            await self._lifespan(receive, send)
            return
        if scope["type"] != "http":
            return
        path = scope.get("path", "")
        api = self.routes.get(path)
        provider = provider_of(api) if api else ("anthropic" if "messages" in path else "openai")
        if api is None:
            await _answer(send, 404, error_body(provider, 404, f"no route {path}"))
            return
        if scope.get("method") != "POST":
            await _answer(send, 405, error_body(provider, 405, "only POST is served here"),
                          [("allow", "POST")])  # fmt: skip
            return
        self.counts["requests"] += 1
        call = _Call(self, scope, receive, send, api, provider)
        try:
            await call.run()
        except Exception as exc:  # a bug here must not reach the client as a traceback
            self.failed("gateway_error", f"{exc!r}", exc)
            await call.fail(502, "the gateway failed; the request was not charged")
        finally:
            await call.end()
        if call.broken and not call.left:
            raise UpstreamBroken("the upstream broke mid-body; the client's body is cut too")

    async def _lifespan(self, receive: Receive, send: Send) -> None:
        while True:
            message = await receive()
            if message["type"] == "lifespan.startup":
                await send({"type": "lifespan.startup.complete"})
            elif message["type"] == "lifespan.shutdown":
                await self.aclose()
                await send({"type": "lifespan.shutdown.complete"})
                return

    async def aclose(self) -> None:
        """Close the upstream client of this event loop."""
        await self.upstream.aclose()

    # --- bookkeeping --------------------------------------------------------------------

    def failed(self, kind: str, message: str, exc: BaseException | None = None) -> None:
        """Count trouble of ``kind``; log it once per ``log_interval``."""
        self.problems[kind] += 1
        now = time.monotonic()
        if now - self._logged.get(kind, -1e18) >= self.log_interval:
            self._logged[kind] = now
            log.warning("llm gateway: %s: %s (%d so far)", kind, message, self.problems[kind],
                        exc_info=exc if kind == "gateway_error" else None)  # fmt: skip

    def stats(self) -> dict[str, Any]:
        """What this process has done: calls by outcome (``counts``) and trouble by kind
        (``problems``)."""
        return {"counts": dict(self.counts), "problems": dict(self.problems)}

    def prepare(self, api: str, raw: bytes) -> Prepared:
        """The request read by the estimator; a counter that fails is logged and counted, and
        the default heuristic counts instead (never an unchecked request)."""
        try:
            return self.estimator.prepare(api, raw)
        except BadRequest:
            raise
        except Exception as exc:
            self.failed("counter_error", f"the token counter failed: {exc!r}")
            return replace(self.estimator, count=heuristic_tokens).prepare(api, raw)


class _Call:
    """One proxied request (the module docstring's steps)."""

    def __init__(
        self, gw: Gateway, scope: Scope, receive: Receive, send: Send, api: str, provider: str
    ) -> None:
        self.gw = gw
        self.scope = scope
        self.receive = receive
        self.client_send = send
        self.api = api
        self.provider = provider
        self.started = False
        self.finished = False
        self.left = False  # the client went away (``_watch``, or a send that failed)
        self.watcher: asyncio.Task[None] | None = None
        self.reservation: Reservation | None = None
        self.prepared: Prepared | None = None
        self.ending: tuple[str, int | None] | None = None  # ("settle", n) / ("cancel", None)
        self.response: Response | None = None
        self.broken = False

    async def run(self) -> None:
        gw = self.gw
        request = from_scope(self.scope)
        try:
            found = gw.identify(request)
            caller = await found if inspect.isawaitable(found) else found
        except Exception as exc:
            gw.failed("identify_error", f"identify raised {exc!r}")
            await self.fail(500, "the gateway could not tell who the caller is")
            return
        if caller is not None and not isinstance(caller, Caller):
            gw.failed("identify_error", f"identify answered {caller!r}, not a Caller or None")
            await self.fail(500, "the gateway could not tell who the caller is")
            return
        if caller is None:
            gw.counts["unauthorized"] += 1
            await self.fail(401, "the API key is missing or unknown")
            return
        raw = await self._body()
        if raw is None:
            return
        try:
            prepared = self.prepared = gw.prepare(self.api, raw)
        except BadRequest as exc:
            gw.counts["bad_requests"] += 1
            await self.fail(400, str(exc), exc.param)
            return
        try:
            levels, used = gw.limits.levels(caller)
        except Exception as exc:
            gw.failed("limit_error", str(exc))
            await self.fail(500, "the gateway's limits could not be read for this caller")
            return
        if not levels:
            gw.failed("no_limits", f"no limit applies to {caller!r}")
            await self.fail(500, "no limit applies to this caller")
            return
        try:
            reservation = await gw.limiter.reserve(levels, prepared.estimate, ttl=gw.ttl)
        except ConfigError as exc:  # a rate function's answer, a caller's empty key...
            gw.failed("limit_error", str(exc))
            await self.fail(500, "the gateway's limits could not be read for this caller")
            return
        except StoreUnavailable as exc:  # fail_open=False and the store is down
            gw.failed("store_unavailable", str(exc))
            await self.fail(503, "the gateway cannot check its limits now; retry later")
            return
        decision = reservation.decision
        if not reservation.allowed:
            gw.counts["rejected"] += 1
            status, headers, body = refusal(self.provider, decision, levels, used,
                                            prepared.estimate)  # fmt: skip
            await _answer(self.client_send, status, body, headers)
            self.started = self.finished = True
            return
        self.reservation = reservation
        gw.counts["admitted"] += 1
        limit_headers: list[tuple[str, str]] = []
        if not decision.degraded:
            requests, tokens = (
                tightest(decision, used, "requests"),
                tightest(decision, used, "tokens"),
            )
            render = anthropic_headers if self.provider == "anthropic" else openai_headers
            limit_headers = render(requests, tokens) + _ratekeeper_headers(decision, used)
        self._watch()
        await self._forward(prepared, limit_headers)

    async def _body(self) -> bytes | None:
        """The request body, at most ``max_request_bytes`` (else a 413 and None)."""
        chunks = []
        size = 0
        more = True
        while more:
            message = await self.receive()
            if message["type"] == "http.disconnect":
                self.left = self.started = self.finished = True
                return None
            chunk = message.get("body", b"")
            size += len(chunk)
            if size > self.gw.max_request_bytes:
                self.gw.counts["too_large"] += 1
                await self.fail(413, f"the body is over {self.gw.max_request_bytes:_} bytes")
                return None
            chunks.append(chunk)
            more = message.get("more_body", False)
        return b"".join(chunks)

    def _watch(self) -> None:
        """Notice the client's disconnect while the response streams."""

        async def watch() -> None:
            while True:
                message = await self.receive()
                if message["type"] == "http.disconnect":
                    self.left = True
                    return

        self.watcher = asyncio.ensure_future(watch())

    async def _send(self, message: Message) -> None:
        if self.left:
            return
        try:
            await self.client_send(message)
        except OSError:  # servers that raise on a closed connection (ASGI 2.4)
            self.left = True

    async def _forward(self, prepared: Prepared, limit_headers: list[tuple[str, str]]) -> None:
        gw = self.gw
        headers = [(k.decode("latin-1"), v.decode("latin-1")) for k, v in self.scope["headers"]]
        query = self.scope.get("query_string", b"").decode("latin-1")
        try:
            response = self.response = await gw.upstream.send(
                "POST", self.scope["path"], query, headers, prepared.body
            )
        except UpstreamError as exc:
            gw.failed("upstream_unreachable", str(exc))
            self.ending = ("cancel", None)
            status = 504 if exc.timeout else 502
            await self.fail(status, "the upstream did not answer; the request was not charged")
            return
        streams = response.streams
        meter: Meter = (
            StreamMeter(
                self.api, gw.estimator.count, gw.max_event_bytes, text=gw.on_disconnect == "close"
            )
            if streams
            else BodyMeter(self.api, gw.estimator.count, gw.max_body_bytes)
        )
        start = {"type": "http.response.start", "status": response.status,
                 "headers": _encode([*response.headers, *limit_headers])}  # fmt: skip
        self.started = True
        await self._send(start)
        how = await self._stream(response, meter)
        if how == "broken":  # the client's body breaks too: it must not look whole
            self.finished = self.broken = True
        else:
            await self._send({"type": "http.response.body", "body": b"", "more_body": False})
            self.finished = True
        try:
            meter.close()
        except Exception as exc:
            meter.problem("meter_error", repr(exc))
        if response.status < 400:
            for kind, message in meter.problems.items():
                gw.failed(kind, message)
        try:
            charge = charge_of(meter, prepared, how, response.status, gw.price)
        except Exception as exc:  # the app's price function: logged, the estimate stands
            gw.failed("price_error", repr(exc))
            charge = prepared.estimate
        self.ending = ("cancel", None) if charge is None else ("settle", charge)

    async def _stream(self, response: Response, meter: Meter) -> str:
        """Pass the body on as it comes; how the reading ended (``settling.HOWS``)."""
        gw = self.gw
        loop = asyncio.get_running_loop()
        deadline = loop.time() + gw.stream_timeout
        feeding = True
        how = "complete"
        draining = False
        send = self.client_send
        feed = meter.feed
        try:
            async with asyncio.timeout_at(deadline) as timer:
                async for chunk in response.body():
                    if feeding:
                        try:
                            feed(chunk)
                        except Exception as exc:  # a bug in a meter: the estimate stands
                            meter.problem("meter_error", repr(exc))
                            feeding = False
                    if self.left:
                        if draining:
                            continue
                        gw.counts["disconnects"] += 1
                        if gw.on_disconnect == "close":
                            how = "left"
                            break
                        draining = True
                        timer.reschedule(min(deadline, loop.time() + gw.drain_timeout))
                        continue
                    try:
                        await send({"type": "http.response.body", "body": chunk,
                                    "more_body": True})  # fmt: skip
                    except OSError:  # servers that raise on a closed connection
                        self.left = True
        except TimeoutError:
            how = "timeout"
            if draining:
                meter.problem("drain_timeout", "the client left and the stream did not end "
                                               "within drain_timeout; it was cut")  # fmt: skip
            else:
                meter.problem("stream_timeout", "the stream did not end in time; it was cut")
        except Exception as exc:  # the upstream broke mid-body
            how = "broken"
            gw.failed("upstream_broken", repr(exc))
        finally:
            try:
                await response.aclose()
            except Exception as exc:
                gw.failed("upstream_broken", repr(exc))
        return how

    async def fail(self, status: int, message: str, param: str | None = None) -> None:
        """Answer the client with an error in the API's format, if no answer has started; else
        end the body that has."""
        if self.finished:
            return
        if self.started:
            await self._send({"type": "http.response.body", "body": b"", "more_body": False})
        else:
            body = error_body(self.provider, status, message, param)
            self.started = True
            await _answer(self._send, status, body)
        self.finished = True

    async def end(self) -> None:
        """Settle or cancel the reservation, once, whatever happened (shielded)."""
        if self.watcher is not None:
            self.watcher.cancel()
        if self.response is not None and self.ending is None:
            await asyncio.shield(self.response.aclose())
        reservation = self.reservation
        if reservation is None or reservation.decision.degraded:
            return
        self.reservation = None
        if self.ending is None:  # cut short: the estimate stands once the upstream was asked
            prepared = self.prepared
            if self.response is not None and prepared is not None:
                self.ending = ("settle", prepared.estimate)
            else:
                self.ending = ("cancel", None)
        kind, amount = self.ending
        limiter = self.gw.limiter
        if kind == "cancel":
            task = asyncio.ensure_future(limiter.cancel(reservation))
        else:
            task = asyncio.ensure_future(limiter.settle(reservation, amount or 0))
        task.add_done_callback(self._ended)
        with contextlib.suppress(Exception):  # counted by _ended
            await asyncio.shield(task)

    def _ended(self, task: asyncio.Task[Any]) -> None:
        """Count a settle or cancel once it is done (even when the app was cancelled)."""
        gw = self.gw
        if task.cancelled():
            gw.failed("settle_error", "the settle was cancelled")
        elif task.exception() is not None:
            gw.failed("settle_error", repr(task.exception()))
        else:
            gw.counts["cancelled" if self.ending and self.ending[0] == "cancel" else "settled"] += 1


def _ratekeeper_headers(decision: Any, used: Sequence[Limit]) -> list[tuple[str, str]]:
    """ratekeeper's own ``RateLimit-Policy`` and ``RateLimit`` for the tightest levels."""
    policies, limits = [], []
    for counts in ("tokens", "requests"):
        best = None
        for limit, d in zip(used, decision.levels, strict=True):
            if limit.counts == counts and (best is None or d.remaining < best[1].remaining):
                best = (limit, d)
        if best is not None:
            h = best[1].headers(best[0].label, "tokens" if counts == "tokens" else None)
            policies.append(h["RateLimit-Policy"])
            limits.append(h["RateLimit"])
    if not policies:
        return []
    return [("ratelimit-policy", ", ".join(policies)), ("ratelimit", ", ".join(limits))]


def _encode(headers: Sequence[tuple[str, str]]) -> list[tuple[bytes, bytes]]:
    return [(k.lower().encode("latin-1"), v.encode("latin-1")) for k, v in headers]


async def _answer(
    send: Send, status: int, body: bytes, headers: Sequence[tuple[str, str]] = ()
) -> None:
    head = [("content-type", "application/json"), ("content-length", str(len(body))), *headers]
    await send({"type": "http.response.start", "status": status, "headers": _encode(head)})
    await send({"type": "http.response.body", "body": body})
