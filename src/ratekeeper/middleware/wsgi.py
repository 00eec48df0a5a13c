"""``WSGIRateLimitMiddleware``: pure WSGI (PEP 3333), for Flask, Django & co.

The gate's flow runs with ``Limiter``, ``ConcurrencyLimiter`` and ``FleetUsageShedder`` over one
store. A rejection is answered by the middleware; an allowed response gets its headers through a
wrapped ``start_response``. The app's iterable is wrapped so that leases are released and 304s
refunded when the server calls ``close()`` — after a streamed body, or when the client went away
— and at once if the app raises. An admission interrupted by a ``BaseException`` (a gevent or
eventlet timeout, ``KeyboardInterrupt``, ``SystemExit``) is ended with ``Gate.abort``: what it
was granted is refunded and released before the exception goes on. (A store call interrupted
mid-flight cannot say what it granted: such a lease expires after its ``lease_ttl``.)

A ``NestedCheck`` with ``actual`` settles when the server closes the body (or at once if the
app raises), from the request's ``costs.Usage`` (in the environ under ``costs.USAGE_KEY``):
the bytes the app read from ``wsgi.input`` and sent, the status and headers, what it
reported.

The request's ``Admission`` is left in the environ (``gate.SCOPE_KEY``): a framework
integration walks a route's limits into it after routing (``admit_route``), and the headers
are read when the app starts its response, so they include those limits'.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import Any

from ..clock import Clock
from ..limiter import Limiter
from ..metrics.core import Metrics
from ..quotas.cache import Quotas
from ..stores.base import Store
from ..stores.memory import MemoryStore
from . import status as status_route
from .checks import ChargeWhen, Check, Controls
from .costs import USAGE_KEY, Usage
from .gate import SCOPE_KEY, Admission, Gate, Op, added_headers
from .request import PriorityFunc, RequestInfo, from_environ, trusted_networks
from .responses import STATUS_LINES, Rejection
from .runner import Runner
from .status import check_status_path

StartResponse = Callable[..., Any]
WSGIApp = Callable[[dict[str, Any], StartResponse], Iterable[bytes]]


class _Finishing:
    """The app's response iterable, calling ``on_close`` once when the server closes it; with
    a ``usage``, counting the bytes that go out."""

    __slots__ = ("_on_close", "_result", "_usage")

    def __init__(
        self, result: Iterable[bytes], on_close: Callable[[], None], usage: Usage | None = None
    ) -> None:
        self._result = result
        self._on_close = on_close
        self._usage = usage

    def __iter__(self) -> Iterator[bytes]:
        usage = self._usage
        if usage is None:
            return iter(self._result)
        return _counted(self._result, usage)

    def close(self) -> None:
        try:
            close = getattr(self._result, "close", None)
            if close is not None:
                close()
        finally:
            self._on_close()


def _latin1(headers: Iterable[tuple[str, str]]) -> list[tuple[str, str]]:
    """Header pairs checked to be what PEP 3333 allows (latin-1 text): a value that is not
    raises here, inside the fail-open guard, rather than in the server."""
    out = list(headers)
    for name, value in out:
        name.encode("latin-1")
        value.encode("latin-1")
    return out


class WSGIRateLimitMiddleware:
    """WSGI middleware running ``checks`` in order before the app (see ``ratekeeper.middleware``).

    ``store`` (default: a new ``MemoryStore``) must be a ``Store``, and a ``LeaseStore`` too
    when there are concurrency or fleet checks. ``trusted_proxies`` (addresses or CIDR ranges
    of your load balancers, set once) is what every ``keys.client_ip()`` — the default key of
    every check — applies to ``X-Forwarded-For``.
    """

    def __init__(
        self,
        app: WSGIApp,
        checks: Iterable[Check] = (),
        *,
        store: Any = None,
        clock: Clock = time.time,
        controls: Controls | None = None,
        exempt: Iterable[str] = (),
        priority: PriorityFunc | None = None,
        refund_statuses: Iterable[int] = (304,),
        charge_when: ChargeWhen | None = None,
        log_interval: float = 60.0,
        trusted_proxies: Iterable[str] = (),
        metrics: Metrics | None = None,
        on_error: str = "open",
        quotas: Quotas | None = None,
        status_path: str | None = None,
        problem_details: bool = False,
    ) -> None:
        self.app = app
        self.status_path = check_status_path(status_path)
        self.trusted_proxies = trusted_networks(trusted_proxies)
        self.store: Store = MemoryStore() if store is None else store
        self.gate = Gate(
            checks,
            controls,
            exempt,
            priority,
            refund_statuses,
            clock,
            log_interval,
            charge_when=charge_when,
            metrics=metrics,
            on_error=on_error,
            quotas=quotas,
            problem_details=problem_details,
        )
        self.controls = self.gate.controls
        self.gate.store_label = repr(self.store)
        self.runner = Runner(self.gate, self.store, clock)
        self.limiter: Limiter = self.runner.limiter

    def _status(self, start_response: StartResponse, request: RequestInfo) -> list[bytes]:
        """Answer the status route (``middleware.status``): GET or HEAD only, never charged."""
        if request.method not in ("GET", "HEAD"):
            status, headers, body = status_route.not_allowed()
        else:
            try:
                status, headers, body = self.runner.status(request)
            except Exception as exc:  # a bug or a plan source's garbage: 503, logged
                if self.gate.on_error == "raise":  # tests: see it
                    raise
                self.gate.failed_open("ratekeeper", exc, count=False)
                status, headers, body = status_route.unavailable()
        start_response(STATUS_LINES.get(status, f"{status} Error"), list(headers))
        return [b"" if request.method == "HEAD" else body]

    def execute(self, op: Op) -> Any:
        """Run one of the gate's store operations (``ratekeeper simulate`` drives the gate)."""
        return self.runner.execute(op)

    def __call__(self, environ: dict[str, Any], start_response: StartResponse) -> Iterable[bytes]:
        gate = self.gate
        request = from_environ(environ, self.trusted_proxies)
        if self.status_path is not None and request.path == self.status_path:
            return self._status(start_response, request)
        usage = None
        if gate.settling:
            usage = environ[USAGE_KEY] = Usage()
            if environ.get("wsgi.input") is not None:
                environ["wsgi.input"] = _CountingInput(environ["wsgi.input"], usage)
        adm = environ[SCOPE_KEY] = Admission(request, usage)
        extra: list[tuple[str, str]] = []
        try:
            rejection = self.runner.admit(request, adm)  # interrupted: see the module docstring
            if rejection is not None:
                extra = _latin1(rejection.headers)
        except Exception as exc:  # a bug in ratekeeper must not take the API down
            if gate.on_error == "raise":  # tests: see it
                raise
            gate.failed_open("ratekeeper", exc)
            rejection = adm.rejection = None  # fail open: the request goes through
        if rejection is not None:
            self.runner.finish(adm, rejection.status)
            start_response(rejection.status_line, extra)
            return [b"" if environ.get("REQUEST_METHOD") == "HEAD" else rejection.body]
        if not adm.entered:  # exempt
            return self.app(environ, start_response)
        status: list[int | None] = [None]

        def start_with_headers(line: str, headers: list[tuple[str, str]], *exc_info: Any) -> Any:
            try:
                status[0] = int(line[:3])
            except ValueError:
                status[0] = None
            if usage is not None:
                usage.status = status[0]
                usage.headers = {str(k).lower(): str(v) for k, v in headers}
            # read now: a route's limits may have joined the admission after routing
            added = added_headers(adm)
            if added:
                try:
                    headers = [*headers, *_latin1(added)]
                except Exception as exc:  # never break the app's response
                    gate.failed_open("ratekeeper", exc)
            return start_response(line, headers, *exc_info)

        try:
            result = self.app(environ, start_with_headers)
        except BaseException:
            self.runner.finish(adm, None)
            raise
        return _Finishing(result, lambda: self.runner.finish(adm, status[0]), usage)

    def admit_route(self, adm: Admission, positions: Sequence[int]) -> Rejection | None:
        """Walk a route's checks (``positions``, registered with ``gate.add``) into a request's
        admission after routing; return the rejection to answer with, if any. The hook of the
        framework integrations; this middleware adds the headers and finishes the request."""
        if adm.request is None or not positions:
            return adm.rejection
        return self.runner.admit(adm.request, adm, positions)

    def stats(self) -> dict[str, Any]:
        """Counters per check, requests in flight, the shedding checks' state (``shedding``),
        the limiter's store failures and the errors of the application's functions
        (``user_errors``: per check, per function kind)."""
        return {
            "checks": self.controls.stats(),
            "in_flight": self.gate.in_flight,
            "shedding": self.gate.shedding_stats(),
            "store": self.limiter.stats(),
            "user_errors": self.gate.user_error_stats(),
        }


def _counted(result: Iterable[bytes], usage: Usage) -> Iterator[bytes]:
    """The body's chunks, their bytes added to ``usage``; ``completed`` once it is all out."""
    for chunk in result:
        usage.response_bytes += len(chunk)
        yield chunk
    usage.completed = True


class _CountingInput:
    """``wsgi.input``, adding the bytes the app reads to ``usage``."""

    def __init__(self, stream: Any, usage: Usage) -> None:
        self._stream = stream
        self._usage = usage

    def read(self, *size: int) -> bytes:
        data: bytes = self._stream.read(*size)
        self._usage.request_bytes += len(data)
        return data

    def readline(self, *size: int) -> bytes:
        data: bytes = self._stream.readline(*size)
        self._usage.request_bytes += len(data)
        return data

    def readlines(self, *hint: int) -> list[bytes]:
        lines: list[bytes] = self._stream.readlines(*hint)
        self._usage.request_bytes += sum(map(len, lines))
        return lines

    def __iter__(self) -> Iterator[bytes]:
        for line in self._stream:
            self._usage.request_bytes += len(line)
            yield line
