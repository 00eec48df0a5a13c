"""heartbeat — how many processes share a store: each one registers with an expiry, often.

A process that shares a store's limits calls ``beat`` every few seconds with its id and an
expiry a few beats ahead; the answer is the number of processes whose expiry has not passed,
itself included. A process that stops (killed, or shut down: ``expires_ms=0`` leaves at once)
drops out of the count when its expiry passes. ``local_budget`` divides a limit by this count
when the store is unreachable (fail-local).

Members are {process id: expires_ms}; the Lua twin (``lua/heartbeat.lua``) keeps them in a
sorted set scored by expiry, with a relative TTL a second past the latest expiry.

``LiveCount`` is what one process takes the count to be. While the store cannot be reached
nobody beats, so every member expires there: the first beats after the store is back count
only the processes that have beaten again. So after a failure (a beat, or any call the
process could not make) the count heard before it stays the least for three beats, the time
every live process takes to register again; a process that is really gone drops out after
that.
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


class LiveCount:
    """One process's view of the live count (see the module); ``value`` is None until a
    beat has answered."""

    __slots__ = ("beat_ms", "floor", "gap", "since", "value")

    def __init__(self, beat_ms: int) -> None:
        self.beat_ms = beat_ms
        self.value: int | None = None
        self.floor = self.since = 0
        self.gap = False

    def heard(self, now_ms: int, count: int) -> int:
        """A beat at ``now_ms`` answered ``count``; the live count to use."""
        if self.gap:  # the first answer after a failed beat: members may have expired
            self.floor, self.since, self.gap = self.value or 0, now_ms, False
        count = max(1, count)
        held = now_ms - self.since < 3 * self.beat_ms and count < self.floor
        self.value = self.floor if held else count
        return self.value

    def lost(self) -> None:
        """A call failed (or the process forked): the next answers may count too few."""
        self.gap = True
