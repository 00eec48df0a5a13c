"""Envoy descriptors decided as one nested call: the opt-in ``envoy.nested_domains``.

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
from dataclasses import replace
from typing import Protocol

from ...nested import Level
from ..config.policies import PolicySpec
from .core import Engine
from .results import Result


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
