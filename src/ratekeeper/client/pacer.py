"""``Pacer`` and ``AsyncPacer``: the shells that drive a request's flow, sync and async.

Both hold a ``PacerCore`` (the budgets), an optional ``Shared`` pace, the clock and the
sleep; they differ only where ``await`` appears (``run``). The drop-ins (``httpx``,
``requests``, ``aiohttp``) call ``run`` with three functions of their client: send the
request, read a response's status and headers, discard a response that a retry replaces.

``clock`` (epoch seconds, ``time.time``) and ``sleep`` (``time.sleep``; ``asyncio.sleep``) are
injected, so tests move a ``ManualClock`` in ``sleep`` and never wait.
"""

from __future__ import annotations

import asyncio
import random as _random
import time
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

from ..errors import ConfigError
from .budget import LearnedPolicy
from .core import PacerCore
from .flow import Answer, Hit, Send, Sleep, request_flow
from .request import Outgoing, Partition, whole_server
from .retry import Retries
from .shared import Shared

R = TypeVar("R")


class _PacerBase:
    """What both pacers hold (see the module); the options are the reference's."""

    def __init__(
        self,
        *,
        headroom: float = 0.97,
        burst: int | None = None,
        max_wait: float = 60.0,
        on_max_wait: str = "raise",
        partition: Partition = whole_server,
        retries: Retries | None = None,
        shared: Any = None,
        shared_prefix: str = "rk-client|",
        clock: Callable[[], float] = time.time,
        random: Callable[[], float] = _random.random,
        log_wait_seconds: float = 1.0,
        max_partitions: int = 10_000,
        forget_seconds: float = 600.0,
    ) -> None:
        self.core = PacerCore(
            headroom=headroom,
            burst=burst,
            max_wait=max_wait,
            on_max_wait=on_max_wait,
            partition=partition,
            retries=retries,
            random=random,
            max_partitions=max_partitions,
            forget_seconds=forget_seconds,
        )
        if not callable(clock):
            raise ConfigError(f"clock={clock!r} is not callable; expected e.g. time.time")
        if isinstance(log_wait_seconds, bool) or not isinstance(log_wait_seconds, int | float):
            raise ConfigError(f"log_wait_seconds={log_wait_seconds!r} is invalid; expected seconds")
        self.clock = clock
        self.log_wait_seconds = float(log_wait_seconds)
        self.shared = None if shared is None else Shared(shared, shared_prefix, clock)
        self.core.pooled = self.shared is not None

    def stats(self) -> dict[str, float]:
        """The counters: requests, sent, waited, wait_seconds, refused, retries, ... (the
        reference lists them)."""
        return self.core.stats()

    def policies(self) -> list[LearnedPolicy]:
        """What has been learned of each server's quotas, per partition."""
        return self.core.policies()


class Pacer(_PacerBase):
    """Paces the requests of sync clients (httpx ``Client``, requests); thread-safe."""

    def __init__(self, *, sleep: Callable[[float], None] = time.sleep, **options: Any) -> None:
        super().__init__(**options)
        if not callable(sleep):
            raise ConfigError(f"sleep={sleep!r} is not callable; expected e.g. time.sleep")
        self.sleep = sleep

    def run(
        self,
        request: Outgoing,
        send: Callable[[], R],
        answer_of: Callable[[R], Answer],
        discard: Callable[[R], None],
    ) -> R:
        """Send ``request`` when its budgets allow, again when a refusal may be retried;
        the last response."""
        flow = request_flow(self.core, self.shared, self.clock, request, self.log_wait_seconds)
        response: R | None = None
        result: Any = None
        while True:
            try:
                action = flow.send(result)
            except StopIteration:
                assert response is not None  # the flow ends only after a Send
                return response
            try:
                if isinstance(action, Sleep):
                    self.sleep(action.seconds)
                    result = None
                elif isinstance(action, Send):
                    if response is not None:
                        discard(response)
                    response = None
                    response = send()
                    result = answer_of(response)
                else:
                    result = self._hit(action)
            except BaseException as exc:
                flow.throw(exc)  # the flow gives back the request's charges and re-raises
                raise

    def _hit(self, hit: Hit) -> Any:
        assert self.shared is not None
        return self.shared.limiter().hit(
            hit.key, hit.rate, algorithm="gcra", cost=hit.cost, burst=hit.burst
        )


class AsyncPacer(_PacerBase):
    """Paces the requests of async clients (httpx ``AsyncClient``, aiohttp); one event loop."""

    def __init__(
        self, *, sleep: Callable[[float], Awaitable[None]] = asyncio.sleep, **options: Any
    ) -> None:
        super().__init__(**options)
        if not callable(sleep):
            raise ConfigError(f"sleep={sleep!r} is not callable; expected e.g. asyncio.sleep")
        self.sleep = sleep

    async def run(
        self,
        request: Outgoing,
        send: Callable[[], Awaitable[R]],
        answer_of: Callable[[R], Answer],
        discard: Callable[[R], Awaitable[None]],
    ) -> R:
        """``Pacer.run`` with ``await``."""
        flow = request_flow(self.core, self.shared, self.clock, request, self.log_wait_seconds)
        response: R | None = None
        result: Any = None
        while True:
            try:
                action = flow.send(result)
            except StopIteration:
                assert response is not None  # the flow ends only after a Send
                return response
            try:
                if isinstance(action, Sleep):
                    await self.sleep(action.seconds)
                    result = None
                elif isinstance(action, Send):
                    if response is not None:
                        await discard(response)
                    response = None
                    response = await send()
                    result = answer_of(response)
                else:
                    result = await self._hit(action)
            except BaseException as exc:
                flow.throw(exc)  # the flow gives back the request's charges and re-raises
                raise

    async def _hit(self, hit: Hit) -> Any:
        assert self.shared is not None
        return await self.shared.async_limiter().hit(
            hit.key, hit.rate, algorithm="gcra", cost=hit.cost, burst=hit.burst
        )
