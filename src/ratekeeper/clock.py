"""Clocks: every time-dependent component takes a zero-argument callable returning epoch seconds.

``time.time`` is the default; tests pass a ``ManualClock`` and move it by hand instead of sleeping.
"""

from __future__ import annotations

import threading
from collections.abc import Callable

Clock = Callable[[], float]
"""Any zero-argument callable that returns the current time as epoch seconds."""


class ManualClock:
    """A clock that only moves when told to; thread-safe.

    >>> clock = ManualClock(start=1_700_000_000.0)
    >>> clock.advance(1.5); clock()
    1700000001.5
    """

    __slots__ = ("_lock", "_now")

    def __init__(self, start: float = 1_700_000_000.0) -> None:
        self._now = float(start)
        self._lock = threading.Lock()

    def __call__(self) -> float:
        return self._now

    def now(self) -> float:
        """The current time in epoch seconds."""
        return self._now

    def advance(self, seconds: float) -> None:
        """Move the clock forward (or backward, for skew tests) by ``seconds``."""
        with self._lock:
            self._now += seconds

    def set(self, t: float) -> None:
        """Jump to epoch second ``t``."""
        with self._lock:
            self._now = float(t)

    def __repr__(self) -> str:
        return f"ManualClock({self._now!r})"
