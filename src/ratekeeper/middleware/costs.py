"""Costs known after the response: what a settling check charges once the response has ended.

A ``NestedCheck`` with ``actual=`` reserves its ``cost`` (the estimate) before the app runs,
and settles when the response has ended — ASGI: once the last body chunk
(``more_body=False``) has been sent, or when the client went away or the app was cancelled;
WSGI: when the server closes the body — with ``actual(request, usage)``, a function of the
request and of its ``Usage``:

- ``header("x-usage-tokens")``: a response header the app set (a whole number);
- ``reported()``: what the app told the middleware with ``report(request.scope, n)`` (ASGI;
  ``report(environ, n)`` in WSGI) while it ran — the tokens of a streamed completion,
  counted as they went out, reported as many times as it likes (they add up);
- ``response_bytes()`` / ``request_bytes()``: the body bytes the app sent / read
  (``qu="content-bytes"``);
- any function of ``(RequestInfo, Usage)`` returning a whole number, or None to keep the
  estimate.

For the estimate, ``content_length()`` reads a request's ``Content-Length`` (0 without one,
then settled with the bytes read).

``Usage`` is the per-request record the middleware keeps (``USAGE_KEY`` in the scope or
environ): the response's status and headers, the bytes each way, what the app reported, and
whether the body went out whole (``completed``: False after a disconnect or cancellation, when
``actual`` sees what was sent so far).
"""

from __future__ import annotations

from collections.abc import Callable, MutableMapping
from dataclasses import dataclass, field
from typing import Any

from ..errors import ConfigError
from .request import RequestInfo

USAGE_KEY = "ratekeeper.usage"
"""Where a request's ``Usage`` is kept: the ASGI scope or the WSGI environ."""


@dataclass(slots=True)
class Usage:
    """What one request used, as the middleware saw it and the app reported it."""

    reported: int | None = None
    request_bytes: int = 0
    response_bytes: int = 0
    status: int | None = None
    headers: dict[str, str] = field(default_factory=dict)
    completed: bool = False

    def report(self, units: int) -> None:
        """Add ``units`` (a whole number >= 0) to what this request cost."""
        if isinstance(units, bool) or not isinstance(units, int) or units < 0:
            raise ConfigError(f"reported cost {units!r} is invalid; expected a whole number >= 0")
        self.reported = units if self.reported is None else self.reported + units


def report(scope_or_environ: MutableMapping[str, Any], units: int) -> None:
    """Tell the middleware what this request cost (``request.scope`` in Starlette and FastAPI,
    ``request.environ`` in Flask and Django); calls add up. Without a settling check in
    front of the app, nothing listens: ``ConfigError`` says so."""
    usage = scope_or_environ.get(USAGE_KEY)
    if not isinstance(usage, Usage):
        raise ConfigError(
            "no ratekeeper middleware with a settling check (NestedCheck(actual=...)) is in "
            "front of this request: nothing would charge the reported cost"
        )
    usage.report(units)


Actual = Callable[[RequestInfo, Usage], "int | None"]
"""What a settling check charges once the response has ended (None: the estimate stands)."""


def _whole(text: str | None) -> int | None:
    if text is None:
        return None
    text = text.strip()
    return int(text) if text.isascii() and text.isdigit() and len(text) <= 13 else None


def header(name: str) -> Actual:
    """The value of response header ``name``, a whole number (None when absent or not one)."""
    wanted = name.lower()
    return lambda request, usage: _whole(usage.headers.get(wanted))


def reported() -> Actual:
    """What the app reported with ``report`` (None when it reported nothing)."""
    return lambda request, usage: usage.reported


def response_bytes() -> Actual:
    """The response body's bytes sent."""
    return lambda request, usage: usage.response_bytes


def request_bytes() -> Actual:
    """The request body's bytes the app read."""
    return lambda request, usage: usage.request_bytes


def content_length() -> Callable[[RequestInfo], int]:
    """An estimate: the request's ``Content-Length`` (0 when absent or not a number)."""
    return lambda request: _whole(request.header("content-length")) or 0
