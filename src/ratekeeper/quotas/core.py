"""``LimiterCore``: what the plan calls use of a limiter's shared core, as a protocol.

``limiter.core._Core`` answers it. Naming it here keeps the quotas below the limiter: the
limiter's faces inherit the plan calls (``calls``), and nothing in ``quotas/`` imports the
limiter.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    from ..algorithms import Outcome
    from ..clock import Clock
    from ..decision import Decision
    from ..plan import Op, Plan, Policy
    from .cache import Quotas

QuotaHit = Callable[["LimiterCore", "Quotas", str, object, str, int], "Decision | None"]
"""A plan's limit decided on the fast path (``calls.local_quota_hit``)."""


class LimiterCore(Protocol):
    """The parts of ``limiter.core._Core`` the plan calls read and set."""

    clock: Clock
    counts: dict[str, int]
    quotas: Quotas | None
    quota_hit: QuotaHit | None
    hit_one: Callable[..., Outcome | None] | None

    def now_ms(self) -> int: ...

    def plan_of(self, op: Op, key: str, policy: Policy, cost: int) -> Plan: ...

    def policy_hit(
        self, key: str, policy: Policy, cost: int, now: int | None = None
    ) -> Decision | None: ...
