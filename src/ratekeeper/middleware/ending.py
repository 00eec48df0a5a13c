"""How a request ends: ``Gate.finish`` (refunds and releases), ``Gate.settle`` (the
reservations), ``Gate.abort`` (an admission cut short), and which charges a status keeps.

A ``NestedCheck`` without ``actual`` gives every level back (``unnest``) when a later check
refused the request, it was cut short, the app raised before answering (no status) or the
status is not charged; a ``RateCheck``'s charge stays when the app raised.

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

import threading
from typing import Any

from ..decision import Decision
from ..errors import ConfigError
from ..nested import NestedDecision, Reservation
from ..overload.admission import Ticket
from ..overload.concurrency import Lease
from .admission import Admission
from .checks import ChargeWhen, Check, NestedCheck
from .costs import Usage
from .functions import UserFunctionError, call
from .ops import Failure, Op


class Ending:
    """``Gate``'s end of a request (module docstring); the gate holds the state."""

    checks: list[Check]
    charge_when: ChargeWhen | None
    refund_statuses: frozenset[int]
    settling: bool
    in_flight: int
    _lock: threading.Lock

    def user_failed(self, name: str, err: UserFunctionError, count: bool = True) -> None:
        """See ``Gate.user_failed``."""
        raise NotImplementedError  # Gate's

    def failed_open(self, name: str, exc: BaseException, count: bool = True) -> None:
        """See ``Gate.failed_open``."""
        raise NotImplementedError  # Gate's

    def finish(self, adm: Admission, status: int | None) -> list[Op]:
        """The refunds and releases that end a request, once (``status`` None: the app raised).

        The executor runs each and reports a failure to ``finish_failed``; none depends on
        another's result, so this is a plain list (usually empty) rather than a flow.
        """
        if adm.done:
            return []
        adm.done = True
        if adm.entered:
            lock = self._lock
            lock.acquire()  # not ``with``: cheaper, and every request ends here
            self.in_flight -= 1
            lock.release()
        ops: list[Op] = []
        for index, ticket in adm.tickets:
            ops.append(Op("leave", index, ticket=ticket))
        if self.settling:  # only a settling check makes reservations
            ops += self.settle(adm, status)
        if adm.charged:
            if adm.rejection is not None or adm.aborted:
                for op in adm.charged:
                    ops.append(_undo(op))
            elif status is not None:
                for op in adm.charged:
                    if not self._keeps(op, status):
                        ops.append(_undo(op))
            else:  # the app raised before answering: a nested charge goes back, as a
                # reservation is cancelled (a rate check's stays: the request was made)
                for op in adm.charged:
                    if op.kind == "nest":
                        ops.append(_undo(op))
        for index, lease in adm.leases:
            ops.append(Op("release", index, lease=lease))
        return ops

    def settle(self, adm: Admission, status: int | None) -> list[Op]:
        """The ``settle`` (or ``cancel``) of each reservation the request holds, once
        (``nested_checks.settle_ops``): by ``finish``, or earlier by a middleware that saw the
        response end."""
        return settle_ops(self, adm, status)

    def _keeps(self, op: Op, status: int) -> bool:
        """Whether the charge ``op`` stands for a response with ``status``."""
        return self.keeps(op.position, status)

    def keeps(self, position: int, status: int) -> bool:
        """Whether the rate check at ``position`` keeps its charge for a response with
        ``status`` (``simulate`` asks it too, to replay refunds as they happen)."""
        check = self.checks[position]
        predicate = check.charge_when or self.charge_when  # type: ignore[union-attr]  # a rate check's op
        if predicate is None:
            return status not in self.refund_statuses
        try:
            return bool(call(predicate, status, "charge_when"))
        except UserFunctionError as err:  # the response is sent: keep the charge
            self.user_failed(check.name, err, count=False)
            return True

    def abort(self, adm: Admission, op: Op | None = None, result: Any = None) -> list[Op]:
        """``finish`` for an admission cut short, refunding every charge. ``op`` is the store
        call that was in flight and ``result`` what it returned (a ``Failure``, or None if
        unknown): a charge, lease or admission ticket it granted is given back too."""
        if op is not None and result is not None and not isinstance(result, Failure):
            if op.kind == "acquire" and isinstance(result, tuple):  # (lease, in progress)
                result = result[0]
            if (op.kind == "hit" and isinstance(result, Decision)) or (
                op.kind == "nest" and isinstance(result, NestedDecision)
            ):
                if result.allowed and not result.degraded:
                    adm.charged.append(op)
            elif op.kind == "reserve" and isinstance(result, Reservation):
                if result.allowed and not result.degraded:
                    adm.charged.append(op._replace(reservation=result))
            elif isinstance(result, Lease) and not result.degraded:  # acquire, admit
                adm.leases.append((op.position, result))
            elif isinstance(result, Ticket):  # enter
                adm.tickets.append((op.position, result))
        adm.aborted = True
        return self.finish(adm, None)


def settle_ops(gate: Ending, adm: Admission, status: int | None) -> list[Op]:
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


def actual_cost(gate: Ending, op: Op, adm: Admission) -> int:
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


def _undo(op: Op) -> Op:
    """The operation giving back what ``op`` charged."""
    return op._replace(kind="unnest" if op.kind == "nest" else "refund")
