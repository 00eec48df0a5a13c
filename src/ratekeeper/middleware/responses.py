"""Responses the middleware builds itself: rejections and the headers of allowed responses.

Pure functions of a ``Decision`` (or a concurrency/shedding verdict) returning ``Rejection``
data — status, header pairs, JSON body — that the ASGI and WSGI middlewares only send. Header
pairs are ``str`` and ASCII: a check name outside printable ASCII is percent-encoded in headers
(``decision.ascii_name``; the JSON body keeps it as it is).

Rejection bodies tell the client what happened and what to do::

    {"error": "rate_limited", "limit": 10, "retry_after": 3, "policy": "api",
     "message": "Rate limit 'api' (10/1s) exceeded. Retry after 3 seconds."}

``error`` is ``rate_limited`` (429, or 403 where a check or a plan's limit says so: an
exhausted quota, still with ``Retry-After`` at the period's end), ``concurrency_limited`` (429)
or ``overloaded`` (503).

Problem details (RFC 9457) when the middleware is built with ``problem_details=True`` or the
client's ``Accept`` names ``application/problem+json``: a rate rejection is then the IETF
ratelimit-headers draft's ``quota-exceeded`` problem type (``application/problem+json``: ``type``,
``title``, ``status``, ``detail``, and ``violated-policies``, the names of the policies its
``RateLimit-Policy`` lists that were exceeded), with the fields above kept as extension
members.
Every response decided by a rate check carries the deciding ``Decision``'s headers plus
``X-RateLimit-Resource`` naming the check.

GitHub's convention, which its clients (@octokit/plugin-throttling) act on: a *primary* limit
is used up (``X-RateLimit-Remaining: 0``; the client waits for ``X-RateLimit-Reset``); any
other 429 is a *secondary* rate limit, said in the body's ``message`` ("secondary rate limit"),
with ``Retry-After``. So a rate rejection with nothing left is primary; one whose cost exceeds
what is left, and a concurrency rejection, are secondary.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from dataclasses import dataclass
from functools import lru_cache

from ..decision import Decision, ascii_name

Headers = tuple[tuple[str, str], ...]


@dataclass(frozen=True, slots=True)
class Rejection:
    """A response to send instead of calling the app; a rate rejection keeps its ``decision``
    (the refusing rate, ``retry_after``, ...) for whoever shapes the answer."""

    check: str
    error: str
    status: int
    headers: Headers
    body: bytes
    decision: Decision | None = None
    message: str | None = None
    """The check's own message (``RateCheck(message=...)``), when it has one."""

    @property
    def status_line(self) -> str:
        """``"429 Too Many Requests"``, ``"403 Forbidden"`` or ``"503 Service Unavailable"``
        (WSGI)."""
        return STATUS_LINES.get(self.status, f"{self.status} Error")


STATUS_LINES = {
    200: "200 OK",
    403: "403 Forbidden",
    405: "405 Method Not Allowed",
    429: "429 Too Many Requests",
    503: "503 Service Unavailable",
}


def decision_headers(
    check: str, decision: Decision, unit: str | None = None, item: str | None = None
) -> Headers:
    """The decision's rate-limit headers plus ``X-RateLimit-Resource``: named ``item`` in the
    IETF fields (default: the check's name; a nested check's level), in quota ``unit``."""
    resource = ("X-RateLimit-Resource", ascii_name(check))
    return (*decision.headers(item or check, unit).items(), resource)


def concurrency_headers(headers: Headers, busy: list[tuple[str, int, int]]) -> Headers:
    """``headers`` with each concurrency check's quota added to the IETF fields (items in
    ``qu="concurrent-requests"``, no window): ``busy`` is (name, capacity, in progress)."""
    policy = [_concurrency_policy(n, cap) for n, cap, _ in busy]
    limit = [f"{_item(n)};r={max(0, cap - used)}" for n, cap, used in busy]
    out = dict(headers)
    for field, items in (("RateLimit-Policy", policy), ("RateLimit", limit)):
        out[field] = ", ".join([out[field], *items] if field in out else items)
    return tuple(out.items())


@lru_cache(maxsize=1024)
def _concurrency_policy(name: str, capacity: int) -> str:
    """A concurrency check's ``RateLimit-Policy`` item (built once per check)."""
    return f'{_item(name)};q={capacity};qu="concurrent-requests"'


@lru_cache(maxsize=1024)
def _item(name: str) -> str:
    """A name as a structured-field String (``Decision``'s rule)."""
    return '"' + ascii_name(name).replace("\\", "\\\\").replace('"', '\\"') + '"'


def _seconds(value: float) -> int | None:
    return max(1, math.ceil(value - 1e-9)) if math.isfinite(value) else None


QUOTA_EXCEEDED = "https://iana.org/assignments/http-problem-types#quota-exceeded"
"""The problem type of draft-ietf-httpapi-ratelimit-headers-11 for an exceeded quota policy."""
QUOTA_EXCEEDED_TITLE = "Request cannot be satisfied as assigned quota has been exceeded"
PROBLEM_JSON = "application/problem+json"


def wants_problem(accept: str | None) -> bool:
    """Whether an ``Accept`` header names ``application/problem+json`` (with q > 0)."""
    if not accept or "problem+json" not in accept.lower():
        return False
    for part in accept.split(","):
        media, *params = part.split(";")
        if media.strip().lower() != PROBLEM_JSON:
            continue
        for param in params:
            name, _, value = param.strip().partition("=")
            if name.strip().lower() == "q":
                try:
                    return float(value) > 0
                except ValueError:
                    return False
        return True
    return False


def _build(
    check: str,
    error: str,
    status: int,
    headers: Headers,
    body: Mapping[str, object],
    decision: Decision | None = None,
    message: str | None = None,
    content_type: str = "application/json",
) -> Rejection:
    data = json.dumps(body, separators=(",", ":")).encode()
    return Rejection(
        check,
        error,
        status,
        (
            *headers,
            ("Content-Type", content_type),
            ("Content-Length", str(len(data))),
        ),
        data,
        decision,
        message,
    )


def rate_rejection(
    check: str,
    decision: Decision,
    status: int = 429,
    problem: bool = False,
    item: str | None = None,
    unit: str | None = None,
    own: str | None = None,
) -> Rejection:
    """429 (or ``status`` 403) for a request rate over ``decision.rate``; with ``problem``,
    the draft's ``quota-exceeded`` problem details (module docstring). ``item``: the nested
    check's level that rejected, as headers name it; ``unit``: the quota unit of rates that
    state none (``Decision.headers``); ``own`` replaces the body's message."""
    retry = _seconds(decision.retry_after)
    rate = decision.rate
    if retry is None:
        advice = "This request costs more than the limit allows; it can never succeed."
    else:
        advice = f"Retry after {retry} second{'s' if retry != 1 else ''}."
    if retry is not None and decision.remaining > 0:  # the cost exceeds what is left
        advice = (
            f"You have exceeded a secondary rate limit: this request needs more than the "
            f"{decision.remaining} left. {advice}"
        )
    where = f"{check!r} ({rate.code})" if item is None else f"{item!r} ({rate.code})"
    message = f"Rate limit {where} exceeded. {advice}" if own is None else own
    body: dict[str, object] = {
        "error": "rate_limited",
        "limit": decision.limit,
        "retry_after": retry,
        "policy": check,
        "message": message,
    }
    if item is not None:
        body["level"] = item
    headers = decision_headers(check, decision, unit, item)
    if not problem:
        return _build(check, "rate_limited", status, headers, body, decision, own)
    body = {
        "type": QUOTA_EXCEEDED,
        "title": QUOTA_EXCEEDED_TITLE,
        "status": status,
        "detail": message,
        "violated-policies": [ascii_name(item or check)],
        **body,
    }
    return _build(check, "rate_limited", status, headers, body, decision, own, PROBLEM_JSON)


def concurrency_rejection(check: str, capacity: int, retry_after: int = 1) -> Rejection:
    """429 for too many requests in progress under one key."""
    message = (
        f"You have exceeded a secondary rate limit: too many requests in progress for "
        f"{check!r}, at most {capacity} at a time. Wait for one to finish, then retry."
    )
    body = {
        "error": "concurrency_limited",
        "limit": capacity,
        "retry_after": retry_after,
        "policy": check,
        "message": message,
    }
    headers = concurrency_headers(
        (("Retry-After", str(retry_after)), ("X-RateLimit-Resource", ascii_name(check))),
        [(check, capacity, capacity)],
    )
    return _build(check, "concurrency_limited", 429, headers, body)


def shed_rejection(check: str, retry_after: int, limit: int | None = None) -> Rejection:
    """503 for load shedding: the service protects itself, not a quota of the client's."""
    message = (
        f"The service is overloaded and shed this request ({check!r}). "
        f"Retry after {retry_after} seconds, with backoff."
    )
    body = {
        "error": "overloaded",
        "limit": limit,
        "retry_after": retry_after,
        "policy": check,
        "message": message,
    }
    headers = (("Retry-After", str(retry_after)), ("X-RateLimit-Resource", ascii_name(check)))
    return _build(check, "overloaded", 503, headers, body)
