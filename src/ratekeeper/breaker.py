"""``Breaker``: the circuit breaker that keeps a dead store from adding latency to every call.

One breaker guards one failure domain: the whole store, or one shard of a store that declares
partitions (``stores.base.Partitioned``), so a dead shard degrades only its own keys. Time is
passed in by the caller, and it is *operational* time: every limiter passes its monotonic
clock (``time.monotonic`` unless injected), never its rate clock, so a rate clock that does
not follow real time (a ``ManualClock``, a replayed log, a wall clock stepped back) cannot
keep a breaker open. Nothing here reads a clock or does I/O.

States and timeline, threshold 3, cool-down 0.5 s (doubling up to 30 s)::

    closed   --3 failures in a row-->  open (until now + 0.5 s): every call skips the store
    open     --cool-down over------->  the next call is the one trial; calls meanwhile skip
    trial    --success-------------->  closed (cool-down back to 0.5 s)
    trial    --failure-------------->  open again for 1 s, then 2 s, 4 s ... 30 s

A success in any state closes the breaker. Calls that were already in flight when it opened
and fail afterwards change nothing (only a failed trial doubles the cool-down), so a burst of
concurrent failures cannot push the cool-down straight to its maximum.
"""

from __future__ import annotations

from typing import Literal

from .errors import ConfigError

State = Literal["closed", "failing", "open"]


class Breaker:
    """Consecutive-failure breaker with a doubling cool-down."""

    __slots__ = (
        "cooldown",
        "failures",
        "max_cooldown",
        "min_cooldown",
        "open_until",
        "threshold",
        "trial",
    )

    def __init__(self, threshold: int, cooldown: float, max_cooldown: float) -> None:
        numbers = (cooldown, max_cooldown)
        if (
            isinstance(threshold, bool)
            or not isinstance(threshold, int)
            or threshold < 1
            or not all(isinstance(n, int | float) and not isinstance(n, bool) for n in numbers)
            or not 0 < cooldown <= max_cooldown
        ):
            raise ConfigError(
                f"breaker settings are invalid: threshold={threshold!r}, cooldown={cooldown!r}, "
                f"max_cooldown={max_cooldown!r}; expected a whole threshold >= 1 and "
                "0 < cooldown <= max_cooldown (seconds)"
            )
        self.threshold = threshold
        self.min_cooldown = float(cooldown)
        self.max_cooldown = float(max_cooldown)
        self.cooldown = self.min_cooldown
        self.failures = 0
        self.open_until = 0.0
        self.trial = False

    def allow(self, now: float) -> bool:
        """May a call at ``now`` reach the store? After a cool-down, one trial may."""
        if not self.open_until:
            return True
        if now < self.open_until:
            return False
        self.open_until = now + self.cooldown  # hold other calls off while the trial runs
        self.trial = True
        return True

    def succeeded(self) -> None:
        """The store answered: close."""
        if self.failures:
            self.failures = 0
            self.trial = False
            self.open_until = 0.0
            self.cooldown = self.min_cooldown

    def failed(self, now: float) -> bool:
        """The store failed at ``now``; return True if this failure (re)opened the breaker."""
        self.failures += 1
        if self.trial:  # the trial failed: back off further
            self.trial = False
            self.cooldown = min(self.cooldown * 2, self.max_cooldown)
        elif self.open_until or self.failures < self.threshold:
            return False  # below the threshold, or a call already in flight when it opened
        self.open_until = now + self.cooldown
        return True

    @property
    def state(self) -> State:
        """``closed``, ``failing`` (failures below the threshold) or ``open``."""
        if not self.failures:
            return "closed"
        return "open" if self.open_until else "failing"
