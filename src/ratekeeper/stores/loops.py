"""``PerLoop``: one value per running event loop, for the Redis stores' asyncio side.

A ``redis.asyncio`` client belongs to the event loop that first used it: its pool's lock, its
connections' streams and a batcher's timers and tasks are bound to that loop. Used from another
loop (a second ``asyncio.run``, Django's ``async_to_sync``, a test client that runs the app on
a loop of its own per request, a thread with a loop of its own) they fail — "Event loop is
closed", or a lock bound to another loop — and a limiter that fails open lets everything
through. So every Redis store keeps its asyncio clients, batchers and pipelines per loop:

- ``get()`` returns the running loop's value, built on first use there (``build``); the
  loop of the last call is remembered, so the common case — one loop — costs one
  ``get_running_loop()`` and one identity test;
- the first loop that asks takes the value given as ``first`` (clients made when the store
  was built), so a program with one loop builds nothing twice;
- several threads, each running its own loop, each get their own value (a lock guards the
  table, never the fast path);
- a loop that has closed is forgotten the next time a new loop asks: its value is dropped
  (``drop`` is told), so what the store holds is bounded by the loops alive, not by the loops
  there ever were. A dead loop's connections cannot be closed through it (asyncio refuses
  any call on a closed loop); once dropped, the garbage collector closes their sockets and
  Redis sees them go.

``current()`` is the value of the running loop if it has one, else of the last loop that used
it (or ``first``): what an attribute such as ``RedisStore.batcher`` shows outside a loop.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable
from typing import Generic, TypeVar

T = TypeVar("T")

_NO_LOOP: object = object()


class PerLoop(Generic[T]):
    """A value per running event loop (see the module docstring)."""

    __slots__ = ("_build", "_by_loop", "_drop", "_first", "_last", "_lock")

    def __init__(
        self,
        build: Callable[[], T],
        first: T | None = None,
        drop: Callable[[T], None] | None = None,
    ) -> None:
        self._build = build
        self._first = first
        self._drop = drop
        self._by_loop: dict[asyncio.AbstractEventLoop, T] = {}
        self._lock = threading.Lock()
        self._last: tuple[object, T | None] = (_NO_LOOP, first)
        """(loop, value) of the last call: one tuple, so a thread never reads half of it."""

    def get(self) -> T:
        """The running loop's value (``RuntimeError`` outside a running loop)."""
        loop = asyncio.get_running_loop()
        last = self._last
        if last[0] is loop:
            return last[1]  # type: ignore[return-value]  # set with a value for this loop
        return self._for(loop)

    def _for(self, loop: asyncio.AbstractEventLoop) -> T:
        dropped: list[T] = []
        with self._lock:
            value = self._by_loop.get(loop)
            if value is None:
                for known in [k for k in self._by_loop if k.is_closed()]:
                    dropped.append(self._by_loop.pop(known))
                if self._first is not None:
                    value, self._first = self._first, None
                else:
                    value = self._build()
                self._by_loop[loop] = value
            self._last = (loop, value)
        if self._drop is not None:
            for old in dropped:
                self._drop(old)
        return value

    def current(self) -> T | None:
        """The running loop's value if one is running and has one, else the last used."""
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            return self._last[1]
        with self._lock:
            found = self._by_loop.get(loop)
        return self._last[1] if found is None else found

    def values(self) -> list[T]:
        """Every value held now (the live loops', and ``first`` if no loop took it yet)."""
        with self._lock:
            out = list(self._by_loop.values())
            if self._first is not None:
                out.append(self._first)
        return out

    def loops(self) -> int:
        """How many loops hold a value now (closed loops not yet forgotten included)."""
        with self._lock:
            return len(self._by_loop)

    def pop_running(self) -> T | None:
        """Forget the running loop's value and return it (``aclose``); None if it has none."""
        loop = asyncio.get_running_loop()
        with self._lock:
            value = self._by_loop.pop(loop, None)
            if self._last[0] is loop:  # still shown by ``current()``, never reused by ``get()``
                self._last = (_NO_LOOP, self._last[1])
        return value
