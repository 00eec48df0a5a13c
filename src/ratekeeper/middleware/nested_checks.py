"""``NestedCheck`` in the gate: its walk, and how a request's reservations end.

``nested_walk`` is the gate's step for one ``NestedCheck``: the request's levels (skipped when a
key or rate function says None), one ``nest`` operation (a nested hit) or, with ``actual``,
one ``reserve``; all levels charged or none; a rejection names the level that refused it; the
deciding level's headers join the admission's when it has the least room left.

A ``NestedCheck`` with ``actual`` reserved its estimate when the request was admitted. When
the response has ended (``Gate.settle``, from ``finish`` or from a middleware that saw the last
body chunk go out) each reservation becomes one operation, once:

- ``cancel`` (the estimate given back) when the request was rejected by a later check, cut
  short, the app raised (no status), or the check's ``charge_when`` (else the gate's)
  refuses the status;
- else ``settle`` with the check's ``actual(request, usage)``: the estimate when it answers
  None, and when it raises or answers what is not a whole number from 0 to 10**12 (logged
  once per ``log_interval`` as the check's failure: the response is already on its way).
"""

from __future__ import annotations

from collections.abc import Generator
from typing import Any, Protocol

from ..decision import Decision
from ..errors import ConfigError
from ..nested import NestedDecision
from ..reservations import Reservation
from .checks import Check, NestedCheck
from .costs import Usage
from .ops import Degraded, Op, unwrap
from .request import RequestInfo
from .responses import Rejection, rate_rejection, wants_problem


class Admission(Protocol):
    """What the walk and the settles use of a request's ``gate.Admission`` (``gate`` imports
    this module)."""

    request: RequestInfo | None
    usage: Usage | None
    best: tuple[str, Decision, str | None, str] | None
    settled: bool
    charged: list[Op]
    rejection: Rejection | None
    aborted: bool
    key: str | None


class Gate(Protocol):
    """What the settles use of the ``gate.Gate``."""

    checks: list[Check]

    def keeps(self, position: int, status: int) -> bool: ...
    def failed_open(self, name: str, exc: BaseException, count: bool = True) -> None: ...


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


def settle_ops(gate: Gate, adm: Admission, status: int | None) -> list[Op]:
    """The operations ending ``adm``'s reservations (none the second time: ``adm.settled``);
    they leave ``adm.charged``, so ``finish`` does not give them back again."""
    if adm.settled:
        return []
    adm.settled = True
    reserved = [op for op in adm.charged if op.kind == "reserve"]
    if not reserved:
        return []
    adm.charged = [op for op in adm.charged if op.kind != "reserve"]
    cut = adm.rejection is not None or adm.aborted or status is None
    out = []
    for op in reserved:
        if cut or not gate.keeps(op.position, status):  # type: ignore[arg-type]  # status set when not cut
            out.append(op._replace(kind="cancel"))
        else:
            out.append(op._replace(kind="settle", actual=actual_cost(gate, op, adm)))
    return out


def actual_cost(gate: Gate, op: Op, adm: Admission) -> int:
    """What the check's ``actual`` says the request cost (see the module docstring)."""
    check = gate.checks[op.position]
    assert isinstance(check, NestedCheck) and check.actual is not None
    assert adm.request is not None
    try:
        actual = check.actual(adm.request, adm.usage or Usage())
    except Exception as exc:
        gate.failed_open(check.name, exc, count=False)
        return op.cost
    if actual is None:
        return op.cost
    if isinstance(actual, bool) or not isinstance(actual, int) or not 0 <= actual <= 10**12:
        bad = ConfigError(f"actual cost {actual!r} is invalid; expected a whole number >= 0")
        gate.failed_open(check.name, bad, count=False)
        return op.cost
    return actual
