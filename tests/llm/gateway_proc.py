"""A gateway process for the load tests (``uvicorn --factory tests.llm.gateway_proc:make``),
configured from ``RK_LLM_CONFIG`` (JSON), on a RedisStore, logging each reservation and its
end as JSON lines (the limiter's view: when, what was reserved, what was settled)."""

from __future__ import annotations

import json
import os
import time
from typing import Any

from ratekeeper import AsyncLimiter, RedisStore
from ratekeeper.llm import Caller, Gateway, Limit, callers
from ratekeeper.nested import Reservation, Settlement


class LoggingLimiter(AsyncLimiter):
    """An ``AsyncLimiter`` writing every reserve, settle and cancel to a file."""

    def __init__(self, store: Any, path: str) -> None:
        super().__init__(store, count_decisions=False)
        self.out = open(path, "a", buffering=1)  # noqa: SIM115  # lives as long as the process

    def _log(self, **entry: Any) -> None:
        self.out.write(json.dumps(entry) + "\n")

    async def reserve(self, levels: Any, estimate: int, *, ttl: float = 300.0) -> Reservation:
        r = await super().reserve(levels, estimate, ttl=ttl)
        self._log(
            op="reserve",
            id=r.id,
            at=r.reserved_at,
            estimate=estimate,
            allowed=r.allowed,
            degraded=r.decision.degraded,
            keys=[lv.key for lv in levels],
            names=[lv.name for lv in levels],
        )
        return r

    async def settle(self, reservation: Reservation, actual: int) -> Settlement:
        s = await super().settle(reservation, actual)
        self._log(op="settle", id=reservation.id, at=time.time(), actual=actual, status=s.status)
        return s

    async def cancel(self, reservation: Reservation) -> Settlement:
        s = await super().cancel(reservation)
        self._log(op="cancel", id=reservation.id, at=time.time(), status=s.status)
        return s


def make() -> Gateway:
    config = json.loads(os.environ["RK_LLM_CONFIG"])
    limits = [Limit(scope, rate, counts, aligned=True) for scope, rate, counts in config["limits"]]
    table = {key: Caller(key, org, team) for key, (org, team) in config["callers"].items()}
    store = RedisStore(config["redis"], socket_timeout=5.0)
    log = config["log"] + f".{os.getpid()}"
    return Gateway(
        config["upstream"],
        limits,
        callers(table),
        limiter=LoggingLimiter(store, log),
        on_disconnect=config.get("on_disconnect", "drain"),
    )
