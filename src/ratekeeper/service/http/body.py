"""The HTTP API's requests: ASGI bodies read whole within ``MAX_BODY``, parsed as a JSON object
of known fields, and the fields a protocol reads itself, each a ``BadRequest`` naming the field
when it is wrong."""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any

from ...errors import BadRequest
from ..config.loader import OVER_LIMIT_STATUSES

Scope = MutableMapping[str, Any]


Message = MutableMapping[str, Any]


Receive = Callable[[], Awaitable[Message]]


Send = Callable[[Message], Awaitable[None]]


MAX_BODY = 64 * 1024


async def _body(scope: Scope, receive: Receive) -> bytes:
    message = await receive()
    if message["type"] == "http.request" and not message.get("more_body", False):
        body: bytes = message.get("body", b"")
        if len(body) <= MAX_BODY:  # the whole body, small: its length needs no other check
            return body
    return await _rest(scope, receive, message)


async def _rest(scope: Scope, receive: Receive, message: Message) -> bytes:
    """The body after its first message (its announced length was checked with the head)."""
    chunks: list[bytes] = []
    size = 0
    while True:
        if message["type"] == "http.disconnect":
            raise BadRequest("body", "the client went away before sending the body")
        chunk = message.get("body", b"")
        size += len(chunk)
        if size > MAX_BODY:
            raise BadRequest("body", f"body is over the limit of {MAX_BODY} bytes", 413)
        chunks.append(chunk)
        if not message.get("more_body", False):
            return b"".join(chunks)
        message = await receive()


def _object(raw: bytes, fields: set[str]) -> dict[str, Any]:
    """The body as a JSON object of known fields, or ``BadRequest`` saying what is wrong."""
    value: Any = None
    if raw[:1] == b"{" and raw[-1:] == b"}" and len(raw) <= MAX_BODY:
        try:  # a UTF-8 object, read by the C scanner (json.loads builds a decoder per call)
            text = raw.decode()
            value, end = _SCAN(text, 0)
            if end != len(text):
                value = None
        except (ValueError, StopIteration, RecursionError):
            value = None
    if value is None:  # anything else through json.loads, so its messages stay the same
        value = _slow_object(raw)
    if not isinstance(value, dict):
        raise BadRequest("body", f"the body is a JSON {type(value).__name__}; expected an object")
    if value.keys() <= fields:  # the usual case, checked in C
        return value
    for name in value:
        if name not in fields:  # field "body": the client's text must not become a metric label
            shown = repr(name) if len(name) <= 60 else f"{name[:60]!r}... ({len(name)} chars)"
            expected = ", ".join(sorted(fields))
            raise BadRequest("body", f"unknown field {shown}; expected {expected}")
    return value


def _slow_object(raw: bytes) -> Any:
    if len(raw) > MAX_BODY:
        raise BadRequest("body", f"body is {len(raw)} bytes; the limit is {MAX_BODY}", 413)
    if not raw.strip():
        raise BadRequest("body", "the body is empty; expected a JSON object")
    try:
        return json.loads(raw, parse_constant=_no_constant)
    except (ValueError, RecursionError) as exc:
        raise BadRequest("body", f"the body is not valid JSON: {exc}") from None


def _no_constant(name: str) -> None:
    raise ValueError(f"{name} is not a number JSON allows")


_SCAN: Callable[[str, int], tuple[Any, int]] = json.JSONDecoder(
    parse_constant=_no_constant
).scan_once  # type: ignore[attr-defined]  # set by JSONDecoder.__init__, missing in typeshed


def _optional_bool(req: dict[str, Any], name: str) -> bool | None:
    """An optional boolean field: absent is None; present, it must be true or false."""
    if name not in req:
        return None
    value = req[name]
    if not isinstance(value, bool):
        raise BadRequest(name, f"{name} {value!r} is invalid; expected true or false")
    return value


def _method(method: str, expected: str) -> None:
    if method != expected:
        raise BadRequest("method", f"method {method} is not allowed here; use {expected}", 405)


def _over_limit_status(req: dict[str, Any], default: int) -> int:
    """The status a hit over its limit answers with: the request's ``over_limit_status`` or
    the config's ``limits.over_limit_status``. 200 by default: the call itself succeeded, and
    its answer is "no" (see docs/service.md, "Why over the limit is a 200")."""
    status = req.get("over_limit_status", default)
    if isinstance(status, bool) or status not in OVER_LIMIT_STATUSES:
        raise BadRequest(
            "over_limit_status", f"over_limit_status {status!r} is invalid; expected 200 or 429"
        )
    return int(status)


async def _lifespan(receive: Receive, send: Send) -> None:
    while True:
        message = await receive()
        if message["type"] == "lifespan.startup":
            await send({"type": "lifespan.startup.complete"})
        elif message["type"] == "lifespan.shutdown":
            await send({"type": "lifespan.shutdown.complete"})
            return
