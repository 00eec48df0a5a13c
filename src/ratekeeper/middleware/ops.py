"""The gate's store operations as data, and the loops that carry out a gate's flow.

A gate (``gate.Gate``) walks a request's checks as a generator that yields ``Op``s and is
sent each result back (or a ``Failure``); ``run`` and ``run_async`` drive it with a sync or an
async executor (``runner``). Written apart from the gate so that the modules the gate uses for
one kind of check (``nested_checks``) speak the same operations.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Generator
from dataclasses import dataclass
from typing import Any, Literal, NamedTuple

from ..nested import Reservation
from ..overload.admission import Ticket
from ..overload.concurrency import Lease

Kind = Literal[
    "hit", "refund", "acquire", "admit", "release", "enter", "leave",
    "nest", "unnest", "reserve", "settle", "cancel",
]  # fmt: skip


class Op(NamedTuple):
    """One store operation for the check at ``position`` (a tuple: built on every request).

    ``rate`` is the rate a ``hit`` is charged under (the check's, or the one its rate function
    gave for this request); the refund of that hit carries it too; for a ``NestedCheck`` it
    is the request's ``Level``s. A ``reserve``'s ``Reservation`` rides on its ``settle`` or
    ``cancel`` (``reservation``), with the ``actual`` cost. An ``AdmissionCheck``'s ``enter``
    carries the tier in ``key`` (``wait`` False in shadow mode) and gets a ``Ticket`` or None
    back; its ``leave`` carries the ``ticket``.
    """

    kind: Kind
    position: int
    key: str = ""
    cost: int = 1
    critical: bool = False
    lease: Lease | None = None
    rate: Any = None
    wait: bool = True
    ticket: Ticket | None = None
    reservation: Reservation | None = None
    actual: int = 0


@dataclass(frozen=True, slots=True)
class Failure:
    """What the executor sends back when an operation raised."""

    exc: Exception


class Degraded(Exception):
    """A check answered without its store (it already logged): count as failed open."""


Flow = Generator[Op, Any, None]


def unwrap(result: Any) -> Any:
    """A result sent back to a flow, or its ``Failure``'s exception raised."""
    if isinstance(result, Failure):
        raise result.exc
    return result


def run(flow: Flow, execute: Callable[[Op], Any]) -> None:
    """Drive a gate flow with a sync executor."""
    try:
        op = next(flow)
        while True:
            try:
                result = execute(op)
            except Exception as exc:
                result = Failure(exc)
            op = flow.send(result)
    except StopIteration:
        return


async def run_async(flow: Flow, execute: Callable[[Op], Awaitable[Any]]) -> None:
    """Drive a gate flow with an async executor."""
    try:
        op = next(flow)
        while True:
            try:
                result = await execute(op)
            except Exception as exc:
                result = Failure(exc)
            op = flow.send(result)
    except StopIteration:
        return
