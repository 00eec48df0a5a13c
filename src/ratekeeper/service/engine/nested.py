"""Nested decisions and reservations on the engine's policies: the levels of a request (a
policy and a caller key each, outermost first) -> one all-or-nothing call of the limiter.

A level is a configured rate policy (its rates and algorithm) and a caller key, up to 16.
Level 0 counts on the same counter ``/v1/hit {"policy", "key"}`` uses; a level below counts
inside the outer key's (``ratekeeper.nested``). A level's own ``cost`` is its own (a request
counter beside a token budget: ``1``), never settled; without one a level is charged the
call's cost (or the reservation's estimate).

Policy toggles, per level: ``enabled: false`` leaves the level out (counted nowhere);
``block`` rejects the whole call without the store (the emergency stop); ``shadow`` levels are
looked at and not charged — a would-be rejection is counted in the metrics and flagged on the
answer, never refuses the call (all or nothing leaves no way to count a level that may not
refuse).

A reservation is settled (or cancelled) from what its token said (``NestedSettle``: its id,
time to live and levels): each key checked as ``/v1/hit`` checks one (a token is the client's
to forge), the levels rebuilt from the policies as configured then, and the store's record of
the reservation says where the estimate went. One it does not know settles as an unknown
reservation: the actual cost is charged, within each level's debt bound.

Envoy descriptors decided as one nested call, the opt-in ``envoy.nested_domains``
(``decide_nested``):
Upstream decides each descriptor of a request on its own counter: a request refused by its
user's limit still spends its org's (envoyproxy/ratelimit #435). In a domain listed in
``nested_domains``, a request's limited descriptors are the levels of one nested call
(``ratekeeper.nested``), in the request's order, outermost first: every one is charged or
none is, in one store round trip. What changes against upstream, so it is opt-in:

- the first limited descriptor counts on its own counter, as upstream's; each later one counts
  inside the first's (``user=42`` under ``org=acme`` and under ``org=beta`` are two counters);
- a rejection charges no descriptor, and rejected hits are not counted (upstream's windows
  count them);
- a descriptor of a limit in shadow mode is looked at, never charged, and never refuses the
  others (its would-be rejection is its status's, as in upstream's shadow mode); a limit of
  ``requests_per_unit: 0`` (or a blocked policy) refuses the whole request without the store;
- the over-limit cache is not consulted.

Every request of such a domain is decided this way, one of a single descriptor too, so its
counters are the same whatever else a request carries (upstream's windows, which count
rejected hits, are counters of their own).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any, Protocol

from ...clock import Clock
from ...errors import BadRequest, ConfigError
from ...limiter import AsyncLimiter
from ...nested import (
    MAX_AMOUNT,
    MAX_LEVELS,
    Level,
    NestedDecision,
    Reservation,
    Settlement,
    compile_levels,
    restored,
)
from ...plan import make_policy
from ..config.loader import ServiceConfig
from ..config.policies import PolicySpec
from ..metrics import Metrics
from .keys import store_key
from .results import Result

LEVEL_FIELDS = {"policy", "key", "cost"}
Sent = tuple[str, str, int | None]
"""A level as a reservation's token holds it: policy, key and own cost (None: the call's)."""


class Engine(Protocol):
    """What nested calls use of their ``Engine`` (``core`` imports this module)."""

    limiter: AsyncLimiter
    metrics: Metrics
    config: ServiceConfig
    clock: Clock

    def spec(self, name: object) -> PolicySpec: ...
    def check_key(self, key: object, field: str = "key") -> str: ...
    def fixed(self, op: str, spec: PolicySpec, cost: int) -> Result: ...


@dataclass(frozen=True, slots=True)
class NestedLevels:
    """A request's levels as the limiter takes them, and what the answer needs."""

    levels: list[Level]
    sent: list[Sent]
    """(policy, key, own cost) of each level in ``levels``: what a reservation's token holds."""
    shadow: list[tuple[int, int | None]]
    """Shadow levels (looked at, never refusing): their index in ``levels`` and the cost of
    their own they would have been charged (None: the call's)."""
    blocked: str | None
    """A blocked policy among the levels: the call is rejected without the store."""


@dataclass(frozen=True, slots=True)
class NestedResult:
    """A nested call's or reservation's answer as the service reports it (counted)."""

    levels: NestedLevels
    decision: NestedDecision | None
    """None: answered without the store (a blocked level, or every level switched off)."""
    shadow: bool = False
    """A shadow level would have rejected this call (it was not refused for it)."""
    now: float = 0.0
    """The time of an answer without the store."""
    reservation: Reservation | None = None
    """A reservation made (admitted, not degraded)."""


def whole(value: Any, field: str, low: int, high: int) -> int:
    """A whole number in [low, high] (2.0 is 2, as JSON Schema's integer), or ``BadRequest``."""
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        raise BadRequest(field, f"{field} {value!r} is invalid; expected a whole number from "
                         f"{low} to {high}")  # fmt: skip
    return value


def short(value: Any) -> str:
    """A value as an error message quotes it: its ``repr``, cut at 80 characters."""
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."


class Nested:
    """Nested decisions and reservations over the engine's limiter and policies."""

    def __init__(self, engine: Engine) -> None:
        self.engine = engine

    def levels(self, raw: Any) -> NestedLevels:
        """A request's ``levels`` field (a list of ``{"policy", "key", "cost"?}``), checked
        whole before anything is counted, or ``BadRequest`` naming the item and field."""
        engine = self.engine
        if not isinstance(raw, list) or not 1 <= len(raw) <= MAX_LEVELS:
            raise BadRequest("levels", f"levels {short(raw)} is invalid; expected a list of 1 "
                             f'to {MAX_LEVELS} objects {{"policy", "key", "cost"?}}')  # fmt: skip
        levels: list[Level] = []
        sent: list[Sent] = []
        shadow: list[tuple[int, int | None]] = []
        blocked = None
        for i, item in enumerate(raw):
            field = f"levels[{i}]"
            if not isinstance(item, dict):
                raise BadRequest(field, f"{field} is {short(item)}; expected an object "
                                 '{"policy", "key", "cost"?}')  # fmt: skip
            unknown = sorted(set(item) - LEVEL_FIELDS)
            if unknown:  # the level, not the name: a client's text never becomes a label
                shown = short(unknown[0])
                raise BadRequest(field, f"{field}: unknown field {shown}; expected policy, key, "
                                 "cost")  # fmt: skip
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
                own = whole(own, f"{field}.cost", 0, MAX_AMOUNT)
            if spec.block:
                blocked = blocked or spec.name
            if not spec.enabled:
                continue  # the kill switch: this level is left out
            if spec.shadow:
                shadow.append((len(levels), own))
                own = 0
            levels.append(_level(spec, key, own))
            sent.append((spec.name, key, own))
        return NestedLevels(levels, sent, shadow, blocked)

    async def hit(self, parsed: NestedLevels, cost: int) -> NestedResult:
        """``cost`` on every level, all or nothing."""
        if parsed.blocked is not None or not parsed.levels:
            return NestedResult(parsed, None, now=self.engine.clock())
        try:
            decision = await self.engine.limiter.nested(parsed.levels, cost=cost)
        except ConfigError as exc:
            raise BadRequest("levels", str(exc)) from None
        return self._counted(parsed, decision, cost)

    async def reserve(self, parsed: NestedLevels, estimate: int, ttl: float) -> NestedResult:
        """``estimate`` admitted on every level, all or nothing, held for ``ttl`` seconds."""
        if parsed.blocked is not None or not parsed.levels:
            return NestedResult(parsed, None, now=self.engine.clock())
        try:
            r = await self.engine.limiter.reserve(parsed.levels, estimate, ttl=ttl)
        except ConfigError as exc:
            raise BadRequest("levels", str(exc)) from None
        result = self._counted(parsed, r.decision, estimate)
        if r.allowed and not r.degraded:
            result = replace(result, reservation=r)
        return result

    async def settle(
        self, rid: str, ttl: float, sent: Sequence[Sent], actual: int, cancel: bool = False
    ) -> Settlement:
        """Settle (``actual``) or cancel the reservation ``rid`` of the levels ``sent``."""
        engine = self.engine
        levels = []
        for i, (name, key, own) in enumerate(sent):
            try:  # a token's key gets /v1/hit's checks: a client may have written the token
                key = engine.check_key(key, f"the reservation's level {i} key")
            except BadRequest as exc:
                raise BadRequest("reservation", str(exc)) from None
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
        reservation = restored(rid, tiers, ttl)
        limiter = engine.limiter
        if cancel:
            return await limiter.cancel(reservation)
        return await limiter.settle(reservation, actual)

    def _counted(self, parsed: NestedLevels, d: NestedDecision, cost: int) -> NestedResult:
        """A nested decision counted: the deciding level's outcome, and a shadow level's
        rejection (counted, never answered)."""
        levels = d.levels
        shadow = [
            i for i, own in parsed.shadow if levels[i].remaining < (cost if own is None else own)
        ]
        metrics = self.engine.metrics
        outcome = "allowed" if d.allowed else "rejected"
        metrics.decision(d.names[d.level] or "", "degraded" if d.degraded else outcome)
        for i in shadow:
            metrics.decision(d.names[i] or "", "shadow_rejected")
        return NestedResult(parsed, d, bool(shadow))


def _level(spec: PolicySpec, key: str, own: int | None) -> Level:
    """The limiter's level for ``key`` under a policy: its counter is ``/v1/hit``'s."""
    return Level(
        store_key(spec.name, key), spec.policy.rates, spec.algorithm, spec.burst, spec.buckets,
        spec.aligned, cost=own, name=spec.name,
    )  # fmt: skip


class Item(Protocol):
    """What ``envoy._Item`` carries that a nested call needs."""

    @property
    def spec(self) -> PolicySpec: ...
    @property
    def key(self) -> str: ...
    @property
    def stored(self) -> str: ...
    @property
    def cost(self) -> int: ...


async def decide_nested(engine: Engine, items: Sequence[Item]) -> list[Result]:
    """Each item's ``Result``, all charged or none (see the module docstring)."""
    blocked = any(it.spec.block for it in items)
    live = [i for i, it in enumerate(items) if it.spec.enabled]
    levels = []
    for i in live:
        spec = items[i].spec
        own = 0 if spec.shadow or blocked else items[i].cost
        level = Level(
            items[i].stored, spec.policy.rates, spec.algorithm, spec.burst, spec.buckets,
            spec.aligned, cost=own, name=spec.name,
        )  # fmt: skip
        levels.append(level)
    results: list[Result | None] = [None] * len(items)
    if levels:
        d = await engine.limiter.nested(levels, cost=0)
        for i, decision in zip(live, d.levels, strict=True):
            spec = items[i].spec
            cost = items[i].cost
            label = spec.label or spec.name
            key = items[i].key
            if spec.block:
                results[i] = engine.fixed("hit", spec, cost)
                continue
            if d.degraded:
                engine.metrics.decision(label, "degraded")
                results[i] = Result(decision, spec.name)
                continue
            if spec.shadow:
                over = decision.remaining < cost
                engine.metrics.decision(label, "shadow_rejected" if over else "allowed", key)
                if over:
                    allowed = replace(decision, allowed=True, retry_after=0.0)
                    results[i] = Result(allowed, spec.name, True)
                else:
                    results[i] = Result(decision, spec.name)
                continue
            ok = d.allowed and not blocked
            engine.metrics.decision(label, "allowed" if ok else "rejected", key)
            if ok or not decision.allowed:
                results[i] = Result(decision, spec.name)
            else:  # admitted by its own limit, refused with the others: nothing charged
                results[i] = Result(replace(decision, allowed=True), spec.name)
    for i, it in enumerate(items):
        if results[i] is None:  # switched off: answered allowed without the store
            results[i] = engine.fixed("hit", it.spec, it.cost)
    return [r for r in results if r is not None]
