"""Shared pieces of the gateway tests: a fake upstream and a gateway, each a real uvicorn
server on a free loopback port, and reading what the limiter holds."""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from ratekeeper import ManualClock
from ratekeeper.llm import Caller, Gateway, Limit, callers
from tests.llm.fake_upstream import FakeUpstream
from tests.middleware.servers import uvicorn_server, wait_until

CALLERS = {
    "k1": Caller("k1", "acme", "red"),
    "k2": Caller("k2", "acme", "red"),
    "k3": Caller("k3", "acme", "blue"),
    "k9": Caller("k9", "beta"),
}
LIMITS = [
    Limit("org", "100000/minute"),
    Limit("team", "50000/minute"),
    Limit("key", "2000/minute"),
    Limit("key", "10/minute", counts="requests"),
]
CHAT = "/v1/chat/completions"


def chat(content: str = "hello there", **extra: Any) -> dict[str, Any]:
    return {"model": "m", "messages": [{"role": "user", "content": content}], **extra}


def bearer(key: str, **headers: str) -> dict[str, str]:
    return {"authorization": f"Bearer {key}", **headers}


@contextmanager
def gateway(
    upstream_url: str, limits: list[Limit] | None = None, **options: Any
) -> Iterator[tuple[Gateway, str]]:
    options.setdefault("clock", ManualClock(1_700_000_040.0))
    gw = Gateway(upstream_url, limits or LIMITS, callers(CALLERS), **options)
    with uvicorn_server(gw) as url:
        yield gw, url


@contextmanager
def upstream() -> Iterator[tuple[FakeUpstream, str]]:
    app = FakeUpstream()
    with uvicorn_server(app) as url:
        yield app, url


def used(gw: Gateway, key: str) -> dict[str, int]:
    """What each of the caller's levels has used, by limit name (a look: nothing charged)."""
    levels, limits = gw.limits.levels(CALLERS[key])
    levels = [dataclasses.replace(level, cost=0 if level.cost else None) for level in levels]
    decision = asyncio.run(gw.limiter.nested(levels, cost=0))
    return {
        lim.label: d.limit - d.remaining for lim, d in zip(limits, decision.levels, strict=True)
    }


def ended(gw: Gateway, n: int) -> bool:
    """Wait until ``n`` reservations were settled or cancelled (after the response ended)."""
    return wait_until(lambda: gw.counts["settled"] + gw.counts["cancelled"] >= n, 20.0)
