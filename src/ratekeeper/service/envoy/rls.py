"""Envoy's ``ShouldRateLimit``, answered as envoyproxy/ratelimit answers it (no wire format
here: ``envoy.servicer`` turns an ``Answer`` into Envoy's message).

Per request, in upstream's order:

1. An unknown domain answers ``OK`` for every descriptor (also one with a ``limit``
   override), counted in ``domain_not_found``.
2. Each descriptor finds its limit: its ``limit`` override (a fixed window of that rate; in a
   known domain it applies whether or not the tree matches), else the tree (``envoy.match``).
   Limits named in another matched limit's ``replaces`` are dropped; ``unlimited`` answers
   ``OK`` with ``limit_remaining`` 4294967295 and touches nothing. A descriptor's
   ``hits_addend`` replaces the request's (0 checks without charging); the request's 0 is 1.
3. Each limit is decided on its counter: one per domain, entries and unit (shared by a limit
   override and the configured limit of the same unit), an aligned window that counts rejected
   hits too (``fixed_window``'s ``aligned`` + ``count_rejected``). Over: ``OVER_LIMIT`` with 0
   remaining; ``shadow_mode``: ``OK`` all the same. With ``stop_increment_when_over_limit``, a
   request in which some descriptor would go over charges only those (the others are checked
   without charging); if one is over in the local cache, none is charged.
4. The overall code is ``OVER_LIMIT`` if a descriptor outside quota mode is over, or every
   quota-mode descriptor is; global ``shadow_mode`` turns it ``OK`` (statuses stay).
5. Headers (``response_headers``): none; ``upstream``: RateLimit-Limit/-Remaining/-Reset of
   the descriptor closest to its limit (an over one first); ``ratekeeper``: our headers.
   ``response_dynamic_metadata``: the request and the merged ``metadata`` of passed limits.

``current_limit.name`` is ``rate_limit.name``; ``duration_until_reset`` is whole seconds to
the unit's end (``unit - now % unit``). Stats follow upstream's counters (``EnvoyStats``).
Descriptors extended with ``policy``/``algorithm`` keep our semantics for their own limit.
In a domain of ``envoy.nested_domains`` (opt-in) a request's limits are decided as one
nested call, all or nothing (``engine.nested``).
Work yields to the event loop every ``YIELD_EVERY`` descriptors.
"""

from __future__ import annotations

import asyncio
import math
from collections.abc import Sequence
from typing import Any, NamedTuple

from ...errors import BadRequest
from ...plan import make_policy
from ...rates import Rate
from ..config.envoy import MAX_UINT32, UNIT_SECONDS, UNITS, EnvoyLimit, EnvoyNode, EnvoySettings
from ..config.policies import PolicySpec
from ..engine import Engine, Result, envoy_key, store_key
from ..engine.nested import decide_nested
from ..metrics import EnvoyStats
from .match import Entries, find, override_stats_key

YIELD_EVERY = 64
MAX_RESOLVED = 10_000
"""One-descriptor requests whose resolution (limit, policy, counter and stat keys) is kept."""
UNITS_BY_SECONDS = {seconds: unit for unit, seconds in UNIT_SECONDS.items()}


class Descriptor(NamedTuple):
    """One descriptor of a request, with Envoy's per-descriptor fields."""

    entries: Entries
    hits: int | None = None
    """This descriptor's ``hits_addend`` when set: it replaces the request's; 0 checks only."""
    limit: tuple[int, int] | None = None
    """Envoy's limit override ``(requests_per_unit, unit number)``; the unit is checked."""


class Status(NamedTuple):
    """One descriptor's answer; ``limit`` is None when no limit applied (a named tuple: one
    is made per descriptor, and a frozen dataclass costs several times more to build)."""

    over: bool = False
    remaining: int = 0
    limit: tuple[int, int, str] | None = None
    """``current_limit``: requests_per_unit, unit number, name."""
    reset: float = 0.0
    """``duration_until_reset`` in seconds."""
    result: Result | None = None


class Answer(NamedTuple):
    """The whole reply: overall code, statuses in request order, headers, metadata (a named
    tuple: one is made per request)."""

    over: bool
    statuses: list[Status]
    headers: list[tuple[str, str]]
    metadata: dict[str, Any] | None = None


class _Item(NamedTuple):
    """A limit to decide for the descriptor at ``at``."""

    at: int
    limit: EnvoyLimit
    spec: PolicySpec
    key: str
    stored: str
    cost: int
    stats_key: str
    dynamic: bool


_Resolution = tuple[list[_Item], list[bool]]
"""The limits to decide and which descriptors are unlimited (``Envoy._resolve``)."""

NO_LIMIT = Status()
UNLIMITED = Status(remaining=MAX_UINT32)


class Envoy:
    """Answers ShouldRateLimit from the engine's current config."""

    def __init__(self, engine: Engine, stats: EnvoyStats) -> None:
        self.engine = engine
        self.stats = stats
        self._overrides: dict[tuple[str, int, int], PolicySpec] = {}
        self._resolved: tuple[int, dict[tuple[str, Descriptor, int], _Resolution]] = (
            engine.generation, {}
        )  # fmt: skip
        """Resolutions of single descriptors, with the engine generation they belong to."""

    async def should_rate_limit(
        self, domain: str, descriptors: Sequence[Descriptor], hits: int
    ) -> Answer:
        """One status per descriptor, in order (see the module docstring)."""
        engine = self.engine
        generation = engine.generation  # read before the config: a reload swaps the config first
        config = engine.config  # one config for the whole request, whatever a reload does
        settings = config.envoy
        root = config.domains.get(domain)
        if root is None:
            self.stats.not_found(domain)
            nothing = [NO_LIMIT] * len(descriptors)
            return self._finish(settings, domain, descriptors, hits, nothing, {})
        if len(descriptors) == 1:  # Envoy's usual call: its resolution is cached
            items, unlimited = self._resolve_one(generation, domain, root, descriptors[0], hits)
        else:
            items, unlimited = self._resolve(domain, root, descriptors, hits)
        if items and domain in settings.nested_domains:
            results = await decide_nested(engine, items)  # opt-in: all or nothing
        elif settings.stop_increment_when_over_limit:
            results = await self._stop_increment(items)
        else:
            results = []
            decide_now = engine.decide_now
            for n, item in enumerate(items, 1):
                cost = item.cost
                op = "hit" if cost > 0 else "peek"
                result = decide_now(op, item.spec, item.key, cost, item.stored)
                if result is None:
                    result = await engine.ask(op, item.spec, item.key, cost, item.stored)
                results.append(result)
                if n % YIELD_EVERY == 0:
                    await asyncio.sleep(0)
        statuses: list[Status] = [UNLIMITED if u else NO_LIMIT for u in unlimited]
        by_index: dict[int, _Item] = {}
        for item, result in zip(items, results, strict=True):
            statuses[item.at] = self._status(domain, item, result)
            by_index[item.at] = item
        return self._finish(settings, domain, descriptors, hits, statuses, by_index)

    def _resolve(
        self, domain: str, root: EnvoyNode, descriptors: Sequence[Descriptor], hits: int
    ) -> tuple[list[_Item], list[bool]]:
        """Every descriptor's limit, before anything is charged (bad input raises here)."""
        engine = self.engine
        found: list[_Item | None] = []
        unlimited = [False] * len(descriptors)
        replacing: set[str] = set()
        for i, d in enumerate(descriptors):
            cost = max(1, hits) if d.hits is None else d.hits
            if d.limit is not None:
                spec = self.override(domain, *d.limit)
                limit = EnvoyLimit(spec.name, "", d.limit[0], d.limit[1])
                key = envoy_key(domain, d.entries)
                stats_key = override_stats_key(domain, d.entries)
                found.append(_Item(i, limit, spec, key, key, cost, stats_key, True))
                continue
            match = find(domain, root, d.entries)
            if match is None:
                found.append(None)
                continue
            limit = match.limit
            if limit.replaces:
                replacing.update(limit.replaces)
            if limit.unlimited or limit.policy is None:
                unlimited[i] = True
                found.append(None)
                continue
            spec = engine.spec(limit.policy)
            if limit.upstream:
                key = stored = envoy_key(domain, match.counter)
            else:
                key = envoy_key(domain, d.entries)
                stored = store_key(spec.name, key)
            found.append(_Item(i, limit, spec, key, stored, cost, match.stats_key, match.dynamic))
        if replacing:  # a replaced limit answers OK, as if no limit matched
            items = [it for it in found if it is not None and it.limit.name not in replacing]
        else:
            items = [it for it in found if it is not None]
        for it in items:
            engine.check_key(it.key, "descriptors")
        return items, unlimited

    def _resolve_one(
        self, generation: int, domain: str, root: EnvoyNode, descriptor: Descriptor, hits: int
    ) -> _Resolution:
        """``_resolve`` of one descriptor, remembered until the engine's policies change
        (at most ``MAX_RESOLVED`` of them; callers choose the values, so it is bounded).

        gRPC handler threads resolve while the event loop reloads: each resolution goes
        into the table of the ``generation`` read before the request's config, so one made
        from a config a reload replaced is never kept for the new one."""
        cached, resolved = self._resolved
        if generation != cached:
            if generation < cached:  # a request begun before a reload: answer, keep nothing
                return self._resolve(domain, root, (descriptor,), hits)
            resolved = {}
            self._resolved = (generation, resolved)
        cache_key = (domain, descriptor, hits)
        found = resolved.get(cache_key)
        if found is None:
            found = self._resolve(domain, root, (descriptor,), hits)
            if len(resolved) >= MAX_RESOLVED:
                resolved.clear()
            resolved[cache_key] = found
        return found

    def override(self, domain: str, requests_per_unit: int, unit: int) -> PolicySpec:
        """The policy of a limit override: an upstream-counted fixed window of that rate (0
        requests: always over). Its metrics label leaves the rate out (callers choose it)."""
        cache_key = (domain, requests_per_unit, unit)
        spec = self._overrides.get(cache_key)
        if spec is None:
            rate = Rate(max(requests_per_unit, 1), float(UNIT_SECONDS[unit]))
            spec = PolicySpec(
                f"{domain}/override:{rate.code}",
                make_policy((rate,), "fixed_window", None, None, True, True),
                rate.code, "fixed_window", block=requests_per_unit == 0, aligned=True,
                count_rejected=True, label=f"{domain}/override",
            )  # fmt: skip
            if len(self._overrides) < 10_000:
                self._overrides[cache_key] = spec
        return spec

    async def _one(self, item: _Item, cost: int, op: str = "") -> Result:
        op = op or ("hit" if cost > 0 else "peek")
        result = self.engine.decide_now(op, item.spec, item.key, cost, item.stored)
        if result is None:
            result = await self.engine.ask(op, item.spec, item.key, cost, item.stored)
        return result

    async def _stop_increment(self, items: list[_Item]) -> list[Result]:
        """Upstream reads every counter first; when some would go over, only those are
        charged (``stop_increment_when_over_limit``)."""
        first = [await self._one(item, item.cost, "peek") for item in items]
        over = [not r.decision.allowed or r.shadow for r in first]
        if not any(over):
            return [await self._one(item, item.cost) for item in items]
        if any(r.local for r in first):  # over in the local cache: nothing is charged
            return [
                r if r.local else await self._one(item, 0, "peek")
                for item, r in zip(items, first, strict=True)
            ]
        return [
            await self._one(item, item.cost) if o else r
            for item, r, o in zip(items, first, over, strict=True)
        ]

    def _status(self, domain: str, item: _Item, result: Result) -> Status:
        d = result.decision
        over = not d.allowed or result.shadow
        limit = item.limit
        if limit.upstream:
            current = (limit.requests_per_unit, limit.unit, limit.name)
            count = limit.requests_per_unit
            unit_s = UNIT_SECONDS[limit.unit]
            reset: float = unit_s - math.floor(d.now) % unit_s
        else:
            seconds = d.rate.period_ms // 1000 if d.rate.period_ms % 1000 == 0 else 0
            current = (d.limit, UNITS_BY_SECONDS.get(seconds, 0), limit.name or result.policy)
            count = d.limit
            reset = max(0.0, d.reset_at - d.now)
        if item.cost:
            self.stats.count(domain, item.stats_key, item.dynamic, item.cost, count, d.remaining,
                             over, result.local, result.shadow)  # fmt: skip
        remaining = 0 if over else min(d.remaining, MAX_UINT32)
        return Status(not d.allowed, remaining, current, reset, result)

    def _finish(
        self,
        settings: EnvoySettings,
        domain: str,
        descriptors: Sequence[Descriptor],
        hits: int,
        statuses: list[Status],
        by_index: dict[int, _Item],
    ) -> Answer:
        failed = quota_failed = quota_total = 0
        chosen: Status | None = None
        least = MAX_UINT32
        passed: list[int] = []
        for i, status in enumerate(statuses):
            if status.limit is not None and status.remaining < least:
                chosen, least = status, status.remaining
            item = by_index.get(i)
            quota = settings.quota_mode or (item is not None and item.limit.quota)
            if status.over:
                if quota:
                    quota_failed += 1
                else:
                    failed += 1
                    chosen, least = status, 0
            elif status is not UNLIMITED:
                passed.append(i)
            quota_total += quota
        over = failed > 0 or (quota_total > 0 and quota_total == quota_failed)
        headers = (
            [] if settings.response_headers == "none" else _headers(settings, chosen, statuses)
        )
        if over and settings.shadow_mode:
            over = False
            self.stats.shadowed()
        metadata = None
        if settings.response_dynamic_metadata:
            metadata = _metadata(domain, descriptors, hits, passed, by_index)
        return Answer(over, statuses, headers, metadata)


def _headers(
    settings: EnvoySettings, chosen: Status | None, statuses: list[Status]
) -> list[tuple[str, str]]:
    """The headers ``response_headers`` asks for (see the module docstring)."""
    if settings.response_headers == "upstream":
        if chosen is None or chosen.limit is None:
            return []
        names = settings.header_names
        return [
            (names.limit, str(chosen.limit[0])),
            (names.remaining, str(chosen.remaining)),
            (names.reset, str(math.ceil(chosen.reset))),
        ]
    tightest = None  # ratekeeper's headers: the rejecting result, else the least remaining
    for status in statuses:
        r = status.result
        if r is None:
            continue
        if tightest is None or _tighter(r, tightest):
            tightest = r
    if tightest is None:
        return []
    return list(tightest.decision.headers(tightest.policy).items())


def _tighter(a: Result, b: Result) -> bool:
    da, db = a.decision, b.decision
    if da.allowed != db.allowed:
        return not da.allowed
    return da.remaining < db.remaining


def _metadata(
    domain: str,
    descriptors: Sequence[Descriptor],
    hits: int,
    passed: list[int],
    by_index: dict[int, _Item],
) -> dict[str, Any]:
    """Upstream's response dynamic metadata: the request, and the merged ``metadata`` of the
    limits of the descriptors that passed."""
    described = []
    for d in descriptors:
        one: dict[str, Any] = {"entries": [f"{k}={v}" for k, v in d.entries]}
        if d.limit is not None:
            unit = {v: k for k, v in UNITS.items()}.get(d.limit[1], "UNKNOWN")
            one["limit"] = f"requests_per_unit:{d.limit[0]} unit:{unit}"
        if d.hits is not None:
            one["hitsAddend"] = d.hits
        described.append(one)
    out: dict[str, Any] = {"domain": domain, "descriptors": described}
    if hits:
        out["hitsAddend"] = hits
    merged: dict[str, Any] = {}
    for i in passed:
        item = by_index.get(i)
        if item is not None and item.limit.metadata:
            _merge(merged, item.limit.metadata)
    if merged:
        out["metadata"] = merged
    return out


def _merge(into: dict[str, Any], more: Any) -> None:
    """Add ``more``'s fields; where both hold a mapping, merge them; else the first stays."""
    for key, value in more.items():
        if key not in into:
            into[key] = _copy(value)
        elif isinstance(into[key], dict) and isinstance(value, dict):
            _merge(into[key], value)


def _copy(value: Any) -> Any:
    """A deep copy of plain metadata (merging must not change the config's)."""
    if isinstance(value, dict):
        return {k: _copy(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_copy(v) for v in value]
    return value


def check_override_unit(index: int, unit: int) -> None:
    """A limit override needs a known unit (upstream would crash on UNKNOWN)."""
    if unit not in UNIT_SECONDS:
        names = ", ".join(f"{n} ({name})" for name, n in UNITS.items())
        raise BadRequest(
            "descriptors", f"descriptor {index} limit unit {unit} is not one of {names}"
        )
