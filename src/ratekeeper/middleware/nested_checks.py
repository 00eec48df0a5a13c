"""``NestedCheck`` in the gate: its walk.

``nested_walk`` is the gate's step for one ``NestedCheck``: the request's levels (skipped when a
key or rate function says None), one ``nest`` operation (a nested hit) or, with ``actual``,
one ``reserve``; all levels charged or none; a rejection names the level that refused it; the
deciding level's headers join the admission's when it has the least room left.

How a request's reservations end (``settle`` or ``cancel``, once) is ``ending.settle_ops``.
"""

from __future__ import annotations

from collections.abc import Generator
from typing import Any

from ..nested import NestedDecision, Reservation
from .admission import Admission
from .checks import NestedCheck
from .ops import Degraded, Op, unwrap
from .request import RequestInfo
from .responses import Rejection, rate_rejection, wants_problem


def nested_walk(
    index: int,
    check: NestedCheck,
    request: RequestInfo,
    adm: Admission,
    mode: str,
    problem_details: bool = False,
) -> Generator[Op, Any, Rejection | bool]:
    """One ``NestedCheck``: True if allowed (charged or reserved on every level), False if
    it does not apply to the request, else the rejection (as problem details with
    ``problem_details`` or when the client's ``Accept`` asks, as a rate check's)."""
    if not check.where.applies(request):
        return False
    levels = check.levels_of(request)
    if levels is None:
        return False
    adm.key = levels[0].key
    op = Op("reserve" if check.actual else "nest", index, cost=check.cost_of(request))
    op = op._replace(rate=levels)
    result = unwrap((yield op))
    if isinstance(result, Reservation):
        op = op._replace(reservation=result)
        result = result.decision
    decision: NestedDecision = result
    if decision.degraded:
        raise Degraded
    if not decision.allowed:
        item = decision.names[decision.level]
        problem = problem_details or wants_problem(request.header("accept"))
        return rate_rejection(
            check.name, decision.decision, problem=problem, item=item, unit=check.qu
        )
    adm.charged.append(op)
    if mode == "enforce" and (adm.best is None or decision.remaining < adm.best[1].remaining):
        name = decision.names[decision.level] or check.name
        adm.best = (check.name, decision.decision, check.qu, name)
    return True
