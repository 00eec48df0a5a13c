"""What the pacer knows of a request before it is sent, and the partition it is paced in.

A request is paced under its **server** (scheme, host and port) and a **partition** of that
server: the part of the client that the server limits separately. The default partition is
the whole server (``""``); ``partition=`` takes a function of the request (``Outgoing``):
``by_path_segments(1)`` paces ``/search/...`` apart from ``/repos/...`` (GitHub's ``search``
and ``core`` resources), ``by_header("authorization")`` one budget per API key (the value is
hashed: no secret reaches a log or a store key). A partition function that raises, or returns
something that is not a string, is a ``ConfigError`` for that request: loud, never a request
paced under the wrong budget.

A request says what it expects to cost and how urgent it is in request headers, which the
drop-ins take off before sending: ``Ratekeeper-Tokens`` (the tokens it expects to use,
charged to every token quota, corrected by the response), ``Ratekeeper-Priority`` (an
integer, higher goes first, default 0), ``Ratekeeper-Max-Wait`` (seconds, this request's
own ``max_wait``) and ``Ratekeeper-Partition`` (a name added to the partition: for a server
that limits calls the URL does not tell apart, such as ratekeeper's service, whose policy is
in the body).
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from urllib.parse import urlsplit

from ..errors import ConfigError

TOKENS = "ratekeeper-tokens"
PRIORITY = "ratekeeper-priority"
MAX_WAIT = "ratekeeper-max-wait"
PARTITION = "ratekeeper-partition"
OWN_HEADERS = frozenset({TOKENS, PRIORITY, MAX_WAIT, PARTITION})
"""The request headers the drop-ins read and remove before sending."""


@dataclass(frozen=True, slots=True)
class Outgoing:
    """A request about to be paced: method, URL parts and headers (lower-case names)."""

    method: str
    server: str
    path: str
    headers: Mapping[str, str]
    body_bytes: int = 0
    replayable: bool = True


@dataclass(frozen=True, slots=True)
class Asks:
    """What a request asked of the pacer in its own headers."""

    tokens: int = 0
    priority: int = 0
    max_wait_seconds: float | None = None


Partition = Callable[[Outgoing], str]


def outgoing(
    method: str,
    url: str,
    headers: Iterable[tuple[str, str]],
    body_bytes: int = 0,
    replayable: bool = True,
) -> Outgoing:
    """An ``Outgoing`` from a client's request parts."""
    parts = urlsplit(url)
    port = parts.port
    scheme = parts.scheme.lower() or "http"
    default = {"http": 80, "https": 443}.get(scheme)
    host = (parts.hostname or "").lower()
    server = f"{scheme}://{host}" if port in (None, default) else f"{scheme}://{host}:{port}"
    lowered = {name.lower(): value for name, value in headers}
    return Outgoing(method.upper(), server, parts.path or "/", lowered, body_bytes, replayable)


def asks(request: Outgoing) -> Asks:
    """The request's ``Ratekeeper-*`` headers read, or a ``ConfigError`` naming a bad one."""
    headers = request.headers
    tokens = _integer(TOKENS, headers.get(TOKENS, "0"), 0, 10**12)
    priority = _integer(PRIORITY, headers.get(PRIORITY, "0"), -1000, 1000)
    wait = headers.get(MAX_WAIT)
    max_wait = None
    if wait is not None:
        try:
            max_wait = float(wait)
        except ValueError:
            max_wait = -1.0
        if not (math.isfinite(max_wait) and 0 <= max_wait <= 86400):
            raise ConfigError(f"{MAX_WAIT}: {wait!r} is invalid; expected seconds, 0 to 86400")
    return Asks(tokens, priority, max_wait)


def _integer(name: str, text: str, low: int, high: int) -> int:
    try:
        value = int(text.strip())
    except ValueError:
        value = low - 1
    if not low <= value <= high:
        raise ConfigError(f"{name}: {text!r} is invalid; expected a whole number, {low} to {high}")
    return value


def whole_server(request: Outgoing) -> str:
    """The default partition: one budget per server."""
    return ""


def by_path_segments(count: int) -> Partition:
    """A partition per first ``count`` path segments (``/search/code`` -> ``search`` for 1)."""
    if isinstance(count, bool) or not isinstance(count, int) or count < 1:
        raise ConfigError(f"count={count!r} is invalid; expected a whole number >= 1")

    def partition(request: Outgoing) -> str:
        segments = [s for s in request.path.split("/") if s][:count]
        return "/" + "/".join(segments)

    return partition


def by_header(name: str) -> Partition:
    """A partition per value of a request header (an API key): its SHA-256, shortened."""
    lowered = name.lower()

    def partition(request: Outgoing) -> str:
        value = request.headers.get(lowered, "")
        return hashlib.sha256(value.encode("utf-8", "surrogatepass")).hexdigest()[:16]

    return partition


def partition_of(function: Partition, request: Outgoing) -> str:
    """``function(request)``, checked: a string of at most 256 characters, or a ConfigError;
    with the request's ``Ratekeeper-Partition`` appended (``|name``)."""
    try:
        value = function(request)
    except Exception as exc:
        raise ConfigError(f"the partition function {function!r} raised {exc!r}") from exc
    if not isinstance(value, str) or len(value) > 256:
        raise ConfigError(
            f"the partition function {function!r} returned {value!r}; expected a string of "
            "at most 256 characters"
        )
    named = request.headers.get(PARTITION)
    if named is None:
        return value
    if not 0 < len(named) <= 256 or not named.isprintable():
        raise ConfigError(
            f"{PARTITION}: {named[:300]!r} is invalid; expected 1 to 256 printable characters"
        )
    return f"{value}|{named}"
