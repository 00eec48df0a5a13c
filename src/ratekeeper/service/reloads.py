"""Reloads asked for while one runs share the next one (``Coalesced``).

A reload (SIGHUP, ``POST /v1/admin/reload``, a watched directory's change) reads every config
file again; with hundreds of Envoy files that takes seconds. Asks that come while one runs
wait for the next, which starts when the running one ends and so reads what every one of
them saw on disk: a burst of SIGHUPs costs two reloads, not one each, and each caller gets
the outcome of a reload that began after its ask.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Generic, TypeVar

T = TypeVar("T")


class Coalesced(Generic[T]):
    """``run`` (a coroutine function), called so that at most one runs and one waits."""

    def __init__(self, run: Callable[[], Awaitable[T]]) -> None:
        self._run = run
        self._asked: asyncio.Future[T] | None = None
        """The run the asks made meanwhile will share."""
        self._running: asyncio.Task[None] | None = None

    async def __call__(self) -> T:
        loop = asyncio.get_running_loop()
        asked = self._asked
        if asked is None:
            asked = self._asked = loop.create_future()
            if self._running is None:
                self._running = loop.create_task(self._runs())
        return await asyncio.shield(asked)

    async def _runs(self) -> None:
        try:
            while self._asked is not None:
                asked, self._asked = self._asked, None
                try:
                    outcome = await self._run()
                except BaseException as exc:
                    asked.set_exception(exc)
                    raise
                asked.set_result(outcome)
        finally:
            self._running = None
