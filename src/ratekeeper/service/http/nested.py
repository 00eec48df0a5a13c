"""The HTTP face of nested decisions and reservations: ``/v1/hit`` with ``levels``, and
``/v1/reserve``, ``/v1/settle``, ``/v1/cancel`` — a body's fields read, the engine asked
(``engine.nested``), its answer rendered; the socket side is ``api``'s.

A level is ``{"policy", "key", "cost"?}``, outermost first (org, user, API key), up to 16 (see
``engine.nested`` for what a level counts and how toggles apply). A shadow level's would-be
rejection shows as ``"shadow": true``.

A reservation goes back to the caller as an opaque token (``reservation``): base64url of
``[id, ttl_ms, [[policy, key, own cost or null], ...]]``, so any instance of the service can
settle or cancel it, after a reload too. A forged or altered token settles as an unknown
reservation: the actual cost is charged, within each level's debt bound, never more than a
real settle could.
"""

from __future__ import annotations

import base64
import binascii
import json
import math
from typing import Any

from ...errors import BadRequest
from ...nested import MAX_AMOUNT, MAX_LEVELS, MAX_TTL, Reservation
from ..engine import Engine
from ..engine.nested import NestedResult, Sent, whole

NESTED_FIELDS = {"levels", "cost", "over_limit_status"}
RESERVE_FIELDS = {"levels", "estimate", "ttl", "over_limit_status"}
SETTLE_FIELDS = {"reservation", "actual"}
CANCEL_FIELDS = {"reservation"}
DEFAULT_TTL = 300.0
Answer = tuple[int, Any, list[tuple[bytes, bytes]] | dict[str, str]]
"""Status, JSON body (a dict), headers: what the HTTP layer encodes."""


class NestedAPI:
    """The nested routes' bodies read and their answers rendered, the engine deciding."""

    def __init__(self, engine: Engine) -> None:
        self.engine = engine

    def _over(self, req: dict[str, Any]) -> int:
        status = req.get("over_limit_status", self.engine.config.over_limit_status)
        if isinstance(status, bool) or status not in (200, 429):
            raise BadRequest("over_limit_status", f"over_limit_status {status!r} is invalid; "
                             "expected 200 or 429")  # fmt: skip
        return int(status)

    async def hit(self, req: dict[str, Any]) -> Answer:
        """``/v1/hit`` with ``levels``: all or nothing."""
        if "policy" in req or "key" in req:
            raise BadRequest("levels", "levels replaces policy and key; send one or the other")
        nested = self.engine.nested
        parsed = nested.levels(req.get("levels"))
        cost = whole(req.get("cost", 1), "cost", 0, MAX_AMOUNT)
        over = self._over(req)
        return _answer(await nested.hit(parsed, cost), over, {})

    async def reserve(self, req: dict[str, Any]) -> Answer:
        """``/v1/reserve``: ``estimate`` admitted on every level, all or nothing."""
        nested = self.engine.nested
        parsed = nested.levels(req.get("levels"))
        estimate = whole(req.get("estimate"), "estimate", 0, MAX_AMOUNT)
        ttl = req.get("ttl", DEFAULT_TTL)
        if (
            isinstance(ttl, bool) or not isinstance(ttl, int | float) or not math.isfinite(ttl)
            or not 0.001 <= ttl <= MAX_TTL
        ):  # fmt: skip
            raise BadRequest("ttl", f"ttl {ttl!r} is invalid; expected seconds from 0.001 to "
                             f"{MAX_TTL:.0f}")  # fmt: skip
        over = self._over(req)
        result = await nested.reserve(parsed, estimate, float(ttl))
        if result.decision is None:
            return _answer(result, over, {"reservation": None})
        extra: dict[str, Any] = {"reservation": None, "expires_at": None}
        r = result.reservation
        if r is not None:
            extra = {"reservation": _token(r, result.levels.sent), "expires_at": r.expires_at}
        return _answer(result, over, extra)

    async def settle(self, req: dict[str, Any], cancel: bool = False) -> Answer:
        """``/v1/settle`` (the actual cost) or ``/v1/cancel``."""
        rid, ttl_ms, sent = _untoken(req.get("reservation"))
        actual = 0 if cancel else whole(req.get("actual"), "actual", 0, MAX_AMOUNT)
        done = await self.engine.nested.settle(rid, ttl_ms / 1000, sent, actual, cancel)
        body: dict[str, Any] = {"status": done.status, "settled": done.settled}
        if not cancel:
            body["actual"] = actual
        return 200, body, {}


def _answer(result: NestedResult, over: int, extra: dict[str, Any]) -> Answer:
    """A nested decision's response: the deciding level's fields, each level's, the tightest
    level's headers; without the store, a blocked level's rejection or every level off."""
    parsed = result.levels
    d = result.decision
    if d is None:
        allowed = parsed.blocked is None
        fixed: dict[str, Any] = {
            "allowed": allowed,
            "limit": 0,
            "remaining": 0,
            "reset_at": result.now,
            "retry_after": 0.0 if allowed else None,
            "policy": parsed.blocked,
            "level": None,
            "rejected_by": None,
            "levels": [],
            "degraded": False,
            "shadow": False,
        }
        if parsed.blocked is not None:
            fixed["blocked"] = True
        return (200 if allowed else over), {**fixed, **extra}, {}
    deciding = d.decision
    policy = d.names[d.level]
    body = {
        "allowed": d.allowed,
        "limit": deciding.limit,
        "remaining": deciding.remaining,
        "reset_at": deciding.reset_at,
        "retry_after": deciding.retry_after if math.isfinite(deciding.retry_after) else None,
        "policy": policy,
        "level": d.level,
        "rejected_by": d.rejected_by,
        "levels": [
            {
                "policy": name,
                "key": key,
                "allowed": x.allowed,
                "limit": x.limit,
                "remaining": x.remaining,
                "reset_at": x.reset_at,
                "retry_after": x.retry_after if math.isfinite(x.retry_after) else None,
            }
            for (name, key, _), x in zip(parsed.sent, d.levels, strict=True)
        ],
        "degraded": d.degraded,
        "shadow": result.shadow,
        **extra,
    }
    return (200 if d.allowed else over), body, deciding.header_lines(policy)


def _token(r: Reservation, sent: list[Sent]) -> str:
    raw = json.dumps([r.id, round(r.ttl * 1000), sent], separators=(",", ":"))
    return base64.urlsafe_b64encode(raw.encode()).decode().rstrip("=")


def _untoken(token: Any) -> tuple[str, int, list[Sent]]:
    """A reservation token's id, ttl (ms) and levels, or ``BadRequest`` (never a 500)."""
    bad = BadRequest("reservation", "reservation is invalid; expected the token /v1/reserve "
                     "answered")  # fmt: skip
    if not isinstance(token, str) or not 0 < len(token) <= 8192:
        raise bad
    try:
        raw = base64.urlsafe_b64decode(token + "=" * (-len(token) % 4))
        value = json.loads(raw)
    except (binascii.Error, ValueError, RecursionError):
        raise bad from None
    if not (isinstance(value, list) and len(value) == 3):
        raise bad
    rid, ttl_ms, sent = value
    if not isinstance(rid, str) or not 0 < len(rid) <= 64 or not rid.isascii():
        raise bad
    if isinstance(ttl_ms, bool) or not isinstance(ttl_ms, int) or not 1 <= ttl_ms <= MAX_TTL * 1000:
        raise bad
    if not isinstance(sent, list) or not 1 <= len(sent) <= MAX_LEVELS:
        raise bad
    out = []
    for item in sent:
        if not (isinstance(item, list) and len(item) == 3):
            raise bad
        name, key, own = item
        if not isinstance(name, str) or not isinstance(key, str) or not key:
            raise bad
        if own is not None and (
            isinstance(own, bool) or not isinstance(own, int) or not 0 <= own <= MAX_AMOUNT
        ):
            raise bad
        out.append((name, key, own))
    return rid, ttl_ms, out
