"""One request's way through the pacer, written once as a generator (no I/O).

Like httpx's ``auth_flow``: ``request_flow`` yields what it needs done and is sent the result;
the sync and async pacers (``pacer.py``) drive the same flow, one with ``sleep(...)`` and
``send()``, the other with ``await``. The actions:

- ``Sleep(seconds)``: wait (result: None);
- ``Hit(key, rate, cost, burst)``: book a turn in the shared pace, a GCRA hit (result: the
  ``Decision``; its ``reset_at`` tells the turn);
- ``Send()``: send the request, or send it again (result: its ``Answer``). An exception
  raised by the shell (a transport error, a cancellation) is thrown into the flow, which
  gives back the request's charges and lets it go on.

The flow ends when the request has its final answer (the shell returns the last response).
Before a first send, a wait past ``max_wait`` raises ``WaitTooLong`` (``on_max_wait="raise"``)
or sends at once (``"send"``: the server decides, and the 429 comes back); before a retry
it ends the flow, and the refusal is the answer. So no request ever waits past its
``max_wait``.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable, Generator, Mapping
from dataclasses import dataclass
from typing import Any

from .core import PacerCore, Ticket
from .errors import WaitTooLong
from .request import Outgoing
from .shared import Shared, SharedAsk

log = logging.getLogger("ratekeeper.client")

MAX_SLEEP = 1.0
"""The longest single sleep: a longer wait is asked again after it (an answer that came in
meanwhile may have changed it)."""


@dataclass(frozen=True, slots=True)
class Sleep:
    seconds: float


@dataclass(frozen=True, slots=True)
class Hit:
    key: str
    rate: str
    cost: int
    burst: int


@dataclass(frozen=True, slots=True)
class Send:
    attempt: int


@dataclass(frozen=True, slots=True)
class Answer:
    """What the pacer reads of a response: its status and headers (``headers.header_map``)."""

    status: int
    headers: Mapping[str, str]


Action = Sleep | Hit | Send
Flow = Generator[Action, Any, None]


def request_flow(
    core: PacerCore,
    shared: Shared | None,
    clock: Callable[[], float],
    request: Outgoing,
    log_wait_seconds: float,
) -> Flow:
    """The flow of one request (see the module)."""
    ticket = core.open(request)
    ticket.replays = core.retries.may_retry(
        request.method, "idempotency-key" in request.headers, request.replayable
    )
    deadline = clock() + ticket.max_wait
    while True:
        began = clock()
        sent = yield from _pace(core, shared, clock, ticket, deadline)
        waited = clock() - began
        logged = waited >= log_wait_seconds
        core.waited(ticket, waited, logged)
        if logged:
            log.info(
                "ratekeeper.client: waited %.2f s before %s %s%s (%s)",
                waited, request.method, request.server, request.path, ticket.reason,
            )  # fmt: skip
        if not sent:
            return
        try:
            answer = yield Send(ticket.attempt)
        except BaseException:
            core.release(ticket)
            core.count("transport_errors")
            raise
        again = core.answered(ticket, answer.status, answer.headers, clock())
        if shared is not None and not ticket.booked:
            yield from _book_late(core, shared, ticket)
        if not again:
            return


def _pace(
    core: PacerCore,
    shared: Shared | None,
    clock: Callable[[], float],
    ticket: Ticket,
    deadline: float,
) -> Generator[Action, Any, bool]:
    """Wait until the request may go; False: a retry that would wait past ``max_wait``."""
    try:
        while True:
            now = clock()
            delay = core.try_send(ticket, now)
            if delay <= 0:
                break
            if now + delay > deadline:
                core.leave(ticket)
                if not _past_deadline(core, ticket, now, delay):
                    return False
                break
            yield Sleep(min(delay, MAX_SLEEP))
        if shared is not None:
            asks = shared.asks(ticket, ticket.charged, core.headroom, core.shared_burst)
            ticket.booked = bool(asks)
            for ask in asks:
                if not (yield from _shared_pace(core, clock, ticket, deadline, ask)):
                    if ticket.attempt > 0:  # a retry past max_wait: the refusal is the answer
                        core.release(ticket, sent=False)
                        return False
                    break  # on_max_wait="send": sent anyway
    except BaseException:
        core.leave(ticket)
        core.release(ticket, sent=False)
        raise
    return True


def _past_deadline(
    core: PacerCore, ticket: Ticket, now: float, delay: float, charge: bool = True
) -> bool:
    """Before a first send: raise ``WaitTooLong``, or send anyway (True; ``charge``: take
    the budgets first). Before a retry: False."""
    if ticket.attempt > 0:
        return False
    if core.on_max_wait == "raise":
        core.count("too_long")
        request = ticket.request
        raise WaitTooLong(request.server, ticket.partition, delay, ticket.max_wait, ticket.reason)
    if charge:
        core.send_anyway(ticket, now)
    else:
        core.count("sent_anyway")
    return True


def _book_late(core: PacerCore, shared: Shared, ticket: Ticket) -> Flow:
    """A request sent before its quotas were known books its units in the shared pace once
    they are (the first answers of eight processes count against the pace they then keep)."""
    costs = core.costs(ticket)
    for ask in shared.asks(ticket, costs, core.headroom, core.shared_burst):
        yield Hit(ask.key, ask.rate, ask.cost, ask.queue)
        core.count("shared_hits")
    ticket.booked = True


def _shared_pace(
    core: PacerCore,
    clock: Callable[[], float],
    ticket: Ticket,
    deadline: float,
    ask: SharedAsk,
) -> Generator[Action, Any, bool]:
    """Book the request's turn in the shared pace and wait for it; False: its turn is past
    ``max_wait`` (raised, or sent anyway)."""
    decision = yield Hit(ask.key, ask.rate, ask.cost, ask.queue)
    core.count("shared_hits")
    now = clock()
    if decision.degraded:
        core.count("shared_degraded")
        return True
    if decision.allowed:  # the GCRA's arrival time, less this request's and the burst's units
        wait = decision.reset_at - (ask.cost + ask.burst - 1) * ask.interval - now
    else:  # the queue is full: later than the longest wait
        wait = math.inf
    if wait <= 0:
        return True
    ticket.reason = f"its turn in the shared pace ({ask.rate})"
    if now + wait > deadline:
        if ticket.attempt == 0 and core.on_max_wait == "raise":
            core.release(ticket, sent=False)
        if ticket.attempt == 0:
            _past_deadline(core, ticket, now, wait, charge=False)
        return False
    core.count("shared_waits")
    yield Sleep(wait)
    return True
