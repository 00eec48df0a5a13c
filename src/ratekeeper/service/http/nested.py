"""The service's nested decisions and reservations: ``/v1/hit`` with ``levels``, and
``/v1/reserve``, ``/v1/settle``, ``/v1/cancel`` — the requests checked and answered, no wire
handling (the HTTP layer calls ``NestedAPI``).

A level is ``{"policy", "key", "cost"?}``: a configured rate policy (its rates and algorithm)
and a caller key, outermost first (org, user, API key), up to 16. Level 0 counts on the same
counter ``/v1/hit {"policy", "key"}`` uses; a level below counts inside the outer key's
(``ratekeeper.nested``). ``cost`` on a level is its own (a request counter beside a token
budget: ``1``), never settled; without one a level is charged the call's ``cost`` (or the
reservation's ``estimate``).

Policy toggles, per level: ``enabled: false`` leaves the level out (counted nowhere);
``block`` rejects the whole call without the store (the emergency stop); ``shadow`` levels are
looked at and not charged — a would-be rejection shows as ``"shadow": true`` and in the
metrics, never refuses the call (all or nothing leaves no way to count a level that may not
refuse).

A reservation goes back to the caller as an opaque token (``reservation``): base64url of
``[id, ttl_ms, [[policy, key, own cost or null], ...]]``, so any instance of the service can
settle or cancel it, after a reload too. A settle rebuilds the levels from the policies as
configured then; the store's record of the reservation says where the estimate went. A
forged or altered token settles as an unknown reservation: the actual cost is charged, within
each level's debt bound, never more than a real settle could.
"""

from __future__ import annotations

import base64
import binascii
import json
import math
from dataclasses import dataclass
from typing import Any

from ...errors import BadRequest, ConfigError
from ...nested import MAX_LEVELS, Level, NestedDecision, compile_levels
from ...plan import make_policy
from ...reservations import MAX_AMOUNT, MAX_TTL, Reservation, Settlement, restored
from ..config.policies import PolicySpec
from ..engine import Engine, store_key

NESTED_FIELDS = {"levels", "cost", "over_limit_status"}
RESERVE_FIELDS = {"levels", "estimate", "ttl", "over_limit_status"}
SETTLE_FIELDS = {"reservation", "actual"}
CANCEL_FIELDS = {"reservation"}
LEVEL_FIELDS = {"policy", "key", "cost"}
DEFAULT_TTL = 300.0
Answer = tuple[int, Any, list[tuple[bytes, bytes]] | dict[str, str]]
"""Status, JSON body (a dict), headers: what the HTTP layer encodes."""


@dataclass(frozen=True, slots=True)
class _Levels:
    """A request's levels as the limiter takes them, and what the answer needs."""

    levels: list[Level]
    sent: list[tuple[str, str, int | None]]
    """(policy, key, own cost) of each level in ``levels``: what a reservation's token holds."""
    shadow: list[tuple[int, int | None]]
    """Shadow levels (looked at, never refusing): their index in ``levels`` and the cost of
    their own they would have been charged (None: the call's)."""
    blocked: str | None
    """A blocked policy among the levels: the call is rejected without the store."""


def _whole(value: Any, field: str, low: int, high: int) -> int:
    """A whole number in [low, high] (2.0 is 2, as JSON Schema's integer), or ``BadRequest``."""
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        raise BadRequest(field, f"{field} {value!r} is invalid; expected a whole number from "
                         f"{low} to {high}")  # fmt: skip
    return value


class NestedAPI:
    """Nested decisions and reservations over the engine's limiter and policies."""

    def __init__(self, engine: Engine) -> None:
        self.engine = engine

    def parse(self, raw: Any) -> _Levels:
        """The ``levels`` field, checked whole before anything is counted."""
        engine = self.engine
        if not isinstance(raw, list) or not 1 <= len(raw) <= MAX_LEVELS:
            raise BadRequest("levels", f"levels {_short(raw)} is invalid; expected a list of 1 "
                             f'to {MAX_LEVELS} objects {{"policy", "key", "cost"?}}')  # fmt: skip
        levels: list[Level] = []
        sent: list[tuple[str, str, int | None]] = []
        shadow: list[tuple[int, int | None]] = []
        blocked = None
        seen = set()
        for i, item in enumerate(raw):
            field = f"levels[{i}]"
            if not isinstance(item, dict):
                raise BadRequest(field, f"{field} is {_short(item)}; expected an object "
                                 '{"policy", "key", "cost"?}')  # fmt: skip
            unknown = sorted(set(item) - LEVEL_FIELDS)
            if unknown:
                raise BadRequest(f"{field}.{unknown[0]}", f"{field}: unknown field "
                                 f"{unknown[0]!r}; expected policy, key, cost")  # fmt: skip
            spec = engine.spec(item.get("policy"))
            if spec.plan:  # its rates are the default plan's, for descriptions only
                raise BadRequest(
                    f"{field}.policy",
                    f"{field}: policy {spec.name!r} counts a plan's limit; a level needs a "
                    "policy of its own rates",
                )
            if "key" not in item:
                raise BadRequest(f"{field}.key", f"{field}.key is missing")
            key = engine.check_key(item["key"], f"{field}.key")
            own = item.get("cost")
            if own is not None:
                own = _whole(own, f"{field}.cost", 0, MAX_AMOUNT)
            if (spec.name, key) in seen:
                raise BadRequest(field, f"{field} repeats policy {spec.name!r} and key {key!r}")
            seen.add((spec.name, key))
            if spec.block:
                blocked = blocked or spec.name
            if not spec.enabled:
                continue  # the kill switch: this level is left out
            if spec.shadow:
                shadow.append((len(levels), own))
                own = 0
            levels.append(_level(spec, key, own))
            sent.append((spec.name, key, own))
        return _Levels(levels, sent, shadow, blocked)

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
        parsed = self.parse(req.get("levels"))
        cost = _whole(req.get("cost", 1), "cost", 0, MAX_AMOUNT)
        over = self._over(req)
        if parsed.blocked is not None or not parsed.levels:
            return self._fixed(parsed, over)
        try:
            decision = await self.engine.limiter.nested(parsed.levels, cost=cost)
        except ConfigError as exc:
            raise BadRequest("levels", str(exc)) from None
        return self._answer(parsed, decision, over, {}, cost)

    async def reserve(self, req: dict[str, Any]) -> Answer:
        """``/v1/reserve``: ``estimate`` admitted on every level, all or nothing."""
        parsed = self.parse(req.get("levels"))
        estimate = _whole(req.get("estimate"), "estimate", 0, MAX_AMOUNT)
        ttl = req.get("ttl", DEFAULT_TTL)
        if (
            isinstance(ttl, bool) or not isinstance(ttl, int | float) or not math.isfinite(ttl)
            or not 0.001 <= ttl <= MAX_TTL
        ):  # fmt: skip
            raise BadRequest("ttl", f"ttl {ttl!r} is invalid; expected seconds from 0.001 to "
                             f"{MAX_TTL:.0f}")  # fmt: skip
        over = self._over(req)
        if parsed.blocked is not None or not parsed.levels:
            status, body, headers = self._fixed(parsed, over)
            body["reservation"] = None
            return status, body, headers
        try:
            r = await self.engine.limiter.reserve(parsed.levels, estimate, ttl=float(ttl))
        except ConfigError as exc:
            raise BadRequest("levels", str(exc)) from None
        extra: dict[str, Any] = {"reservation": None, "expires_at": None}
        if r.allowed and not r.degraded:
            extra = {"reservation": _token(r, parsed.sent), "expires_at": r.expires_at}
        return self._answer(parsed, r.decision, over, extra, estimate)

    async def settle(self, req: dict[str, Any], cancel: bool = False) -> Answer:
        """``/v1/settle`` (the actual cost) or ``/v1/cancel``."""
        rid, ttl_ms, sent = _untoken(req.get("reservation"))
        actual = 0 if cancel else _whole(req.get("actual"), "actual", 0, MAX_AMOUNT)
        engine = self.engine
        levels = []
        for i, (name, key, own) in enumerate(sent):
            try:
                spec = engine.spec(name)
            except BadRequest:
                raise BadRequest("reservation", f"the reservation's level {i} is under policy "
                                 f"{name!r}, which is not configured now; its estimate comes "
                                 "back when it expires", 409) from None  # fmt: skip
            levels.append(_level(spec, key, own))
        try:
            tiers = compile_levels(levels, 0, make_policy)
        except ConfigError as exc:
            raise BadRequest("reservation", str(exc)) from None
        reservation = restored(rid, tiers, ttl_ms / 1000)
        limiter = engine.limiter
        done: Settlement = await (
            limiter.cancel(reservation) if cancel else limiter.settle(reservation, actual)
        )
        body: dict[str, Any] = {"status": done.status, "settled": done.settled}
        if not cancel:
            body["actual"] = actual
        return 200, body, {}

    def _fixed(self, parsed: _Levels, over: int) -> Answer:
        """A blocked level (rejected) or every level switched off (allowed): no store."""
        now = self.engine.clock()
        allowed = parsed.blocked is None
        body: dict[str, Any] = {
            "allowed": allowed,
            "limit": 0,
            "remaining": 0,
            "reset_at": now,
            "retry_after": 0.0 if allowed else None,
            "policy": parsed.blocked,
            "level": None,
            "rejected_by": None,
            "levels": [],
            "degraded": False,
            "shadow": False,
        }
        if parsed.blocked is not None:
            body["blocked"] = True
        return (200 if allowed else over), body, {}

    def _answer(
        self, parsed: _Levels, d: NestedDecision, over: int, extra: dict[str, Any], cost: int
    ) -> Answer:
        """A nested decision's response: the deciding level's fields, each level's, the
        tightest level's headers; a shadow level's rejection counted, never answered."""
        levels = d.levels
        shadow = [
            i for i, own in parsed.shadow if levels[i].remaining < (cost if own is None else own)
        ]
        deciding = d.decision
        policy = d.names[d.level]
        label = policy or ""
        metrics = self.engine.metrics
        outcome = "allowed" if d.allowed else "rejected"
        metrics.decision(label, "degraded" if d.degraded else outcome)
        for i in shadow:
            metrics.decision(d.names[i] or "", "shadow_rejected")
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
                for (name, key, _), x in zip(parsed.sent, levels, strict=True)
            ],
            "degraded": d.degraded,
            "shadow": bool(shadow),
            **extra,
        }
        return (200 if d.allowed else over), body, deciding.header_lines(policy)


def _level(spec: PolicySpec, key: str, own: int | None) -> Level:
    """The limiter's level for ``key`` under a policy: its counter is ``/v1/hit``'s."""
    return Level(
        store_key(spec.name, key), spec.policy.rates, spec.algorithm, spec.burst, spec.buckets,
        spec.aligned, cost=own, name=spec.name,
    )  # fmt: skip


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."


def _token(r: Reservation, sent: list[tuple[str, str, int | None]]) -> str:
    raw = json.dumps([r.id, round(r.ttl * 1000), sent], separators=(",", ":"))
    return base64.urlsafe_b64encode(raw.encode()).decode().rstrip("=")


def _untoken(token: Any) -> tuple[str, int, list[tuple[str, str, int | None]]]:
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
