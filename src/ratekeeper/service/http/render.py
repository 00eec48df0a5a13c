"""The HTTP API's responses: status, body and header lines made from what the engine answered
(a decision, a lease, a route's JSON), and the OpenAPI document. Nothing here decides."""

from __future__ import annotations

import json
import math
from functools import lru_cache
from pathlib import Path
from typing import Any

from ..engine import LeaseResult, Result

Response = tuple[int, bytes, list[tuple[bytes, bytes]]]
"""A response: status, body and headers (``content-type`` and ``content-length`` too)."""


Answer = tuple[int, bytes, list[tuple[bytes, bytes]] | bytes]
"""A ``Response``, or one whose headers are the lines HTTP sends (``decide_now``'s ``block``)."""


Headers = dict[str, str] | list[tuple[bytes, bytes]]


_JSON = (b"content-type", b"application/json")


OPENAPI = Path(__file__).with_name("openapi.json")


_PROM = "text/plain; version=0.0.4; charset=utf-8"


def openapi_document(max_key_length: int) -> bytes:
    """The OpenAPI document with this config's key length limit as ``maxLength`` on every
    ``key``, so a request valid by the document is one the service accepts."""
    doc = json.loads(OPENAPI.read_text())
    for schema in doc["components"]["schemas"].values():
        key = schema.get("properties", {}).get("key")
        if key is not None:
            key["maxLength"] = max_key_length
    return json.dumps(doc, indent=1, ensure_ascii=False).encode()


def _encode(status: int, body: Any, headers: Headers) -> Response:
    """A response: its body as bytes (JSON unless bytes already) and its header lines, with
    ``content-type`` (JSON unless given) and ``content-length``; names lower case."""
    payload = body if isinstance(body, bytes) else _dumps(body)
    if isinstance(headers, list):  # a decision's, encoded already
        raw = headers
        raw.append(_JSON)
    elif headers:
        raw = [(k.lower().encode("latin-1"), v.encode("latin-1")) for k, v in headers.items()]
        if "content-type" not in headers:
            raw.append(_JSON)
    else:
        raw = [_JSON]
    raw.append((b"content-length", b"%d" % len(payload)))
    return status, payload, raw


def _dumps(body: Any) -> bytes:
    return json.dumps(body, separators=(",", ":"), allow_nan=False).encode()


def _decision_response(result: Result, over: int) -> Response:
    """A decision's response: 200, or ``over`` when it is a rejection."""
    decision = result.decision
    raw = decision.header_lines(result.policy)
    raw.append(_JSON)
    payload = _result_body(result)
    raw.append((b"content-length", b"%d" % len(payload)))
    return (200 if decision.allowed else over), payload, raw


_INTERNAL = {"error": "internal error", "field": None}


def _result_json(result: Result) -> dict[str, Any]:
    d = result.decision
    return {
        "allowed": d.allowed,
        "limit": d.limit,
        "remaining": d.remaining,
        "reset_at": d.reset_at,
        "retry_after": d.retry_after if math.isfinite(d.retry_after) else None,
        "policy": result.policy,
        "degraded": d.degraded,
        "shadow": result.shadow,
    }


def _result_body(result: Result) -> bytes:
    """``_result_json`` encoded as ``json.dumps`` would (compact), without building the dict:
    the body of every decision."""
    d = result.decision
    if not math.isfinite(d.reset_at):  # never from a store; json.dumps refuses it, as before
        return json.dumps(_result_json(result), separators=(",", ":"), allow_nan=False).encode()
    retry = d.retry_after
    return _RESULT % (
        b"true" if d.allowed else b"false",
        d.limit,
        d.remaining,
        float.__repr__(d.reset_at).encode(),
        float.__repr__(retry).encode() if math.isfinite(retry) else b"null",
        _json_string(result.policy),
        b"true" if d.degraded else b"false",
        b"true" if result.shadow else b"false",
    )


_RESULT = (
    b'{"allowed":%s,"limit":%d,"remaining":%d,"reset_at":%s,"retry_after":%s,'
    b'"policy":%s,"degraded":%s,"shadow":%s}'
)


@lru_cache(maxsize=1024)
def _json_string(text: str) -> bytes:
    return json.dumps(text).encode()


def _lease_json(lease: LeaseResult) -> dict[str, Any]:
    out: dict[str, Any] = {
        "acquired": lease.acquired,
        "lease": lease.lease,
        "limit": lease.limit,
        "in_use": lease.in_use,
        "expires_at": lease.expires_at,
        "policy": lease.policy,
        "degraded": lease.degraded,
        "shadow": lease.shadow,
    }
    if not lease.acquired:
        out["error"] = "concurrency_limited"
        out["message"] = (  # "secondary rate limit": GitHub's clients back off on it
            f"You have exceeded a secondary rate limit: {lease.limit} requests of this key are "
            f"already in progress under {lease.policy!r}; retry when one of them has finished"
        )
    return out
