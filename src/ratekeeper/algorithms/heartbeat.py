"""heartbeat — how many processes share a store: each one registers with an expiry, often.

A process that shares a store's limits calls ``beat`` every few seconds with its id and an
expiry a few beats ahead; the answer is the number of processes whose expiry has not passed,
itself included. A process that stops (killed, or shut down: ``expires_ms=0`` leaves at once)
drops out of the count when its expiry passes. ``local_budget`` divides a limit by this count
when the store is unreachable (fail-local).

Members are {process id: expires_ms}; the Lua twin (``lua/heartbeat.lua``) keeps them in a
sorted set scored by expiry, with a relative TTL a second past the latest expiry.
"""

from __future__ import annotations

Members = dict[str, int]


def beat(
    members: Members | None, now_ms: int, process: str, expires_ms: int
) -> tuple[int, Members]:
    """Register ``process`` until ``expires_ms`` (0: leave now); return the live count and
    the members kept."""
    kept = {p: e for p, e in (members or {}).items() if e > now_ms}
    if expires_ms > 0:
        kept[process] = expires_ms
    else:
        kept.pop(process, None)
    return len(kept), kept


def expires(members: Members) -> int:
    """When the members stop mattering: the latest expiry (0 for none)."""
    return max(members.values(), default=0)
