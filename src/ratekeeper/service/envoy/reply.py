"""``RateLimitResponse`` bytes from an ``rls.Answer``: the overall code and the statuses
are encoded here (protobuf's wire format: tag, varint or length-prefixed bytes), the parts
that vary little or are rare through Envoy's generated message.

A reply is built on every ``ShouldRateLimit``, and building the message (nested constructors,
then serializing) cost more than the decision's own arithmetic. Each distinct
``current_limit`` is serialized once by protobuf and kept; per status only the code,
``limit_remaining`` and ``duration_until_reset`` are encoded. Headers and dynamic metadata
(fields 3 and 6, after the statuses, as protobuf orders them) go through the generated
message. tests/service/test_rls_reply.py holds the bytes equal to protobuf's own encoding
of the same answer.
"""

from __future__ import annotations

from typing import Any

from envoy.service.ratelimit.v3 import rls_pb2 as pb

from .rls import Answer

Response = pb.RateLimitResponse
MAX_UINT32 = 2**32 - 1
MAX_LIMITS = 10_000
"""Encoded ``current_limit``s kept (limit overrides come from callers: bounded)."""
_SMALL = [bytes((n,)) for n in range(128)]
_CODE = (bytes((0x08, Response.OK)), bytes((0x08, Response.OVER_LIMIT)))
"""Field 1 (``overall_code`` / ``code``), varint: not over, over."""


def varint(n: int) -> bytes:
    """Protobuf's base-128 varint of ``n`` >= 0."""
    if n < 128:
        return _SMALL[n]
    out = bytearray()
    while n > 127:
        out.append(n & 127 | 128)
        n >>= 7
    out.append(n)
    return bytes(out)


def duration(seconds: float) -> bytes:
    """Field 4 of a status, ``duration_until_reset`` (a ``Duration`` of ``seconds`` >= 0,
    to the nanosecond; present when zero)."""
    whole = int(seconds)
    nanos = 0
    if seconds != whole:
        nanos = round((seconds - whole) * 1e9)
        if nanos == 10**9:  # a hair below the next second rounds to it
            whole, nanos = whole + 1, 0
    body = b"\x08" + varint(whole) if whole else b""
    if nanos:
        body += b"\x10" + varint(nanos)
    return b"\x22" + _SMALL[len(body)] + body


class ReplyEncoder:
    """Encodes answers; keeps each ``current_limit``'s bytes (safe from many threads: one
    dict read or write at a time)."""

    def __init__(self) -> None:
        self._limits: dict[tuple[int, int, str], bytes] = {}

    def encode(self, answer: Answer) -> bytes:
        """The serialized ``RateLimitResponse`` of ``answer``."""
        parts = [_CODE[answer.over]]
        limits = self._limits
        for status in answer.statuses:
            body = _CODE[status.over]
            limit = status.limit
            if limit is not None:
                body += limits.get(limit) or self._limit(limit)
            if status.remaining:
                body += b"\x18" + varint(status.remaining)
            if limit is not None:
                body += duration(status.reset)
            parts.append(b"\x12" + varint(len(body)) + body)
        if answer.headers or answer.metadata is not None:
            parts.append(_rest(answer))
        return b"".join(parts)

    def _limit(self, limit: tuple[int, int, str]) -> bytes:
        """Field 2 of a status, ``current_limit``, serialized by protobuf."""
        requests, unit, name = limit
        message = Response.RateLimit(
            requests_per_unit=min(requests, MAX_UINT32), unit=unit, name=name
        )
        raw: bytes = message.SerializeToString()
        encoded = b"\x12" + varint(len(raw)) + raw
        if len(self._limits) >= MAX_LIMITS:
            self._limits.clear()
        self._limits[limit] = encoded
        return encoded


def _rest(answer: Answer) -> bytes:
    """Fields 3 (``response_headers_to_add``) and 6 (``dynamic_metadata``)."""
    response: Any = Response(
        response_headers_to_add=[{"key": k, "value": v} for k, v in answer.headers]
    )
    if answer.metadata is not None:
        response.dynamic_metadata.update(answer.metadata)
    return response.SerializeToString()  # type: ignore[no-any-return]
