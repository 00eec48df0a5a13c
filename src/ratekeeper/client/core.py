"""``PacerCore``: every server's and partition's budgets, and the rules that pace requests.

No I/O and no sleeping: the flow (``flow.py``) asks ``try_send`` how long a request must wait,
sleeps through its shell, and reports the answer with ``answered``. One lock guards the state,
so threads (the sync drop-ins) and tasks (the async ones) share a core.

A request may go when, in its partition:

1. no refusal's wait is running (``Retry-After``, a refused quota's reset, or after a 429 that
   said nothing ``backoff_seconds * 2**n``: the reactive mode of a server that sends no
   policy), nor, for a retry, its own jitter after it;
2. the partition has been answered once, or nothing else is in flight (slow start);
3. every budget (``budget.Budget``) has room for it now: what is left, and the pace;
4. no waiting request ranked ahead of it (higher ``priority``; the same, opened earlier) is
   ready to go: that one goes first.

Partitions are kept for the ``max_partitions`` most recently used; a budget not stated by any
answer for ``forget_seconds`` is dropped once its reset has passed (the server may have
changed its policy and stopped saying so).
"""

from __future__ import annotations

import math
import random as _random
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

from ..errors import ConfigError
from .budget import Budget, LearnedPolicy
from .headers import Observation, Quota, read
from .request import Asks, Outgoing, Partition, asks, partition_of, whole_server
from .retry import Retries

PROBE_SECONDS = 0.005
"""How often a request polls while its server's first answer is awaited (slow start: until a
partition has been answered once, one request at a time, so a burst of callers learns the
policy from one answer instead of meeting it as 429s)."""
YIELD_SECONDS = 0.002
"""How long a request that could go steps aside for a higher-ranked one that is ready."""
MAX_BUDGETS = 32
"""Quotas kept per partition (a server stating more is cut off: it bounds memory)."""
STATS = (
    "requests", "sent", "waited", "wait_seconds", "waits_logged", "too_long", "sent_anyway",
    "refused", "reactive", "retries", "retries_denied", "transport_errors",
    "answers_with_policy", "answers_without_policy", "shared_hits", "shared_waits",
    "shared_degraded",
)  # fmt: skip


@dataclass(slots=True)
class Ticket:
    """One request through the pacer, across its attempts."""

    request: Outgoing
    asks: Asks
    partition: str
    rank: tuple[int, int]
    max_wait: float
    seq: int = -1
    """The send order of the latest attempt (an answer to an older one is stale)."""
    attempt: int = 0
    charged: list[tuple[Budget, float]] = field(default_factory=list)
    ready_at: float = math.inf
    reason: str = ""
    replays: bool = False
    not_before: float = -math.inf
    sent_at: float = -math.inf
    booked: bool = False
    """The latest attempt took its turn in the shared pace (else it is booked once answered)."""
    sent_to: _Partition | None = None


class _Partition:
    __slots__ = (
        "answers",
        "blocked_reason",
        "blocked_until",
        "budgets",
        "in_flight",
        "refusals",
        "used_at",
        "waiting",
    )

    def __init__(self) -> None:
        self.budgets: dict[tuple[str, str | None], Budget] = {}
        self.blocked_until = -math.inf
        self.blocked_reason = ""
        self.refusals = 0
        self.used_at = 0.0
        self.waiting: dict[int, Ticket] = {}
        self.answers = 0
        self.in_flight = 0


def _number(name: str, value: object, low: float, high: float) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or not low <= value <= high:
        raise ConfigError(f"{name}={value!r} is invalid; expected a number, {low} to {high}")
    return float(value)


class PacerCore:
    """The pacing state of one client (see the module)."""

    def __init__(
        self,
        *,
        headroom: float = 0.97,
        burst: int | None = None,
        max_wait: float = 60.0,
        on_max_wait: str = "raise",
        partition: Partition = whole_server,
        retries: Retries | None = None,
        random: Callable[[], float] = _random.random,
        max_partitions: int = 10_000,
        forget_seconds: float = 600.0,
    ) -> None:
        self.headroom = _number("headroom", headroom, 0.05, 1.0)
        if burst is not None and (
            isinstance(burst, bool) or not isinstance(burst, int) or not 1 <= burst <= 10**6
        ):
            raise ConfigError(f"burst={burst!r} is invalid; expected None or a whole number >= 1")
        self.burst = burst
        """Units sent at once under a quota's pace in this process (None: the quota's limit,
        so what the server says is left may go at once)."""
        self.shared_burst = 1 if burst is None else burst
        """... and under the pace shared with other processes (None: 1, evenly spaced)."""
        self.max_wait = _number("max_wait", max_wait, 0, 86400)
        if on_max_wait not in ("raise", "send"):
            raise ConfigError(f"on_max_wait={on_max_wait!r} is invalid; expected 'raise' or 'send'")
        self.on_max_wait = on_max_wait
        if not callable(partition):
            raise ConfigError(f"partition={partition!r} is invalid; expected a function")
        self.partition = partition
        self.retries = Retries() if retries is None else retries
        if not isinstance(self.retries, Retries):
            raise ConfigError(f"retries={retries!r} is invalid; expected a Retries")
        self.random = random
        self.max_partitions = int(_number("max_partitions", max_partitions, 1, 10**7))
        self.forget_seconds = _number("forget_seconds", forget_seconds, 1, 10**7)
        self.pooled = False
        """Budgets are shared with other processes (set by the pacer with ``shared=``)."""
        self._lock = threading.Lock()
        self._parts: dict[tuple[str, str], _Partition] = {}
        self._opened = 0
        self._sent = 0
        self._stats: dict[str, float] = dict.fromkeys(STATS, 0)
        self._stats["wait_seconds"] = 0.0

    # --- before sending -----------------------------------------------------------------------

    def open(self, request: Outgoing) -> Ticket:
        """A ticket for ``request`` (its ``Ratekeeper-*`` headers and partition read and
        checked: a ``ConfigError`` names a bad one)."""
        wanted = asks(request)
        partition = partition_of(self.partition, request)
        with self._lock:
            self._opened += 1
            self._stats["requests"] += 1
            rank = (-wanted.priority, self._opened)
        wait = self.max_wait if wanted.max_wait_seconds is None else wanted.max_wait_seconds
        return Ticket(request, wanted, partition, rank, wait)

    def _part(self, ticket: Ticket, now: float) -> _Partition:
        key = (ticket.request.server, ticket.partition)
        part = self._parts.get(key)
        if part is None:
            if len(self._parts) >= self.max_partitions:
                oldest = min(self._parts, key=lambda k: self._parts[k].used_at)
                del self._parts[oldest]
            part = self._parts[key] = _Partition()
        part.used_at = now
        return part

    def try_send(self, ticket: Ticket, now: float) -> float:
        """0.0 when the request may go now (its budgets are charged), else the seconds to
        wait before asking again (``ticket.reason`` says for what)."""
        with self._lock:
            part = self._part(ticket, now)
            delay, reason = part.blocked_until - now, part.blocked_reason
            if ticket.not_before - now > delay:
                delay, reason = ticket.not_before - now, "its retry's turn (Retry-After and jitter)"
            costs = []
            for budget in part.budgets.values():
                cost = budget.cost_of(ticket.asks.tokens, ticket.request.body_bytes)
                costs.append((budget, cost))
                wait = budget.delay(cost, now, self.headroom, self.burst)
                if wait > delay:
                    delay, reason = wait, _describe(budget, now)
            if delay <= 0 and part.answers == 0 and part.in_flight > 0:
                delay, reason = PROBE_SECONDS, "the server's first answer"
            if delay <= 0:
                for other in part.waiting.values():
                    if other.rank < ticket.rank and other.ready_at <= now + YIELD_SECONDS:
                        delay, reason = YIELD_SECONDS, "a request of higher priority"
                        break
            if delay > 0:
                ticket.ready_at, ticket.reason = now + delay, reason
                part.waiting[ticket.rank[1]] = ticket
                return delay
            self._take(ticket, part, costs, now)
            return 0.0

    def send_anyway(self, ticket: Ticket, now: float) -> None:
        """Charge the budgets and send (``on_max_wait="send"``: the server decides)."""
        with self._lock:
            part = self._part(ticket, now)
            costs = [
                (b, b.cost_of(ticket.asks.tokens, ticket.request.body_bytes))
                for b in part.budgets.values()
            ]
            self._take(ticket, part, costs, now)
            self._stats["sent_anyway"] += 1

    def _take(
        self, ticket: Ticket, part: _Partition, costs: list[tuple[Budget, float]], now: float
    ) -> None:
        part.waiting.pop(ticket.rank[1], None)
        for budget, cost in costs:
            budget.take(cost, now, self.headroom)
        ticket.charged = costs
        ticket.sent_at = now
        part.in_flight += 1
        ticket.sent_to = part
        self._sent += 1
        ticket.seq = self._sent
        self._stats["sent"] += 1

    def costs(self, ticket: Ticket) -> list[tuple[Budget, float]]:
        """What the request costs each budget its partition has now."""
        with self._lock:
            part = self._parts.get((ticket.request.server, ticket.partition))
            budgets = [] if part is None else list(part.budgets.values())
            return [(b, b.cost_of(ticket.asks.tokens, ticket.request.body_bytes)) for b in budgets]

    def leave(self, ticket: Ticket) -> None:
        """The request gives up waiting (too long, cancelled): it no longer ranks."""
        with self._lock:
            part = self._parts.get((ticket.request.server, ticket.partition))
            if part is not None:
                part.waiting.pop(ticket.rank[1], None)

    def waited(self, ticket: Ticket, seconds: float, logged: bool) -> None:
        """Count a request's wait before it was sent."""
        with self._lock:
            if seconds > 0:
                self._stats["waited"] += 1
                self._stats["wait_seconds"] += seconds
            self._stats["waits_logged"] += int(logged)

    def count(self, name: str, amount: int = 1) -> None:
        """Add to one of the ``STATS``."""
        with self._lock:
            self._stats[name] += amount

    # --- after sending ------------------------------------------------------------------------

    def release(self, ticket: Ticket, sent: bool = True) -> None:
        """The request was not answered (a transport error, a cancellation: its charges are
        no longer in flight), or not ``sent`` after all (they are given back)."""
        with self._lock:
            if not sent:
                for budget, cost in ticket.charged:
                    budget.untake(cost)
            self._release(ticket)

    def _release(self, ticket: Ticket) -> None:
        for budget, cost in ticket.charged:
            budget.answered(cost)
        ticket.charged = []
        if ticket.sent_to is not None:
            ticket.sent_to.in_flight -= 1
            ticket.sent_to = None

    def answered(self, ticket: Ticket, status: int, headers: Mapping[str, str], now: float) -> bool:
        """Learn from an answer; True: send the request again (not before
        ``ticket.not_before``: the refusal's wait and its jitter), False: it is final."""
        seen = read(headers, now)
        with self._lock:
            part = self._part(ticket, now)
            costs = {id(budget): cost for budget, cost in ticket.charged}
            self._release(ticket)
            part.answers += 1
            self._learn(part, seen, ticket.seq, now, costs, ticket.sent_at)
            refused = status == 429 or (status == 503 and seen.retry_after_seconds is not None)
            if not refused:
                part.refusals = 0
                if status < 500:
                    self.retries.budget.succeeded()
                return False
            self._stats["refused"] += 1
            wait = self._refusal_wait(part, seen, now)
            part.blocked_until = max(part.blocked_until, now + wait)
            part.blocked_reason = f"a {status} refusal's wait"
            retries = self.retries
            allowed = retries.budget.refused()
            if status not in retries.statuses or ticket.attempt + 1 >= retries.attempts:
                return False
            if not ticket.replays:
                return False
            if not allowed:
                self._stats["retries_denied"] += 1
                return False
            ticket.attempt += 1
            self._stats["retries"] += 1
            ticket.not_before = now + wait * (1 + self.random() * retries.jitter)
            return True

    def _learn(
        self,
        part: _Partition,
        seen: Observation,
        seq: int,
        now: float,
        costs: dict[int, float],
        sent_at: float,
    ) -> None:
        self._stats["answers_with_policy" if seen.quotas else "answers_without_policy"] += 1
        for quota in seen.quotas:
            key = (quota.name, quota.partition)
            budget = part.budgets.get(key)
            if budget is None:
                if len(part.budgets) >= MAX_BUDGETS:
                    continue
                pooled = self.headroom if self.pooled else None
                budget = Budget(quota.name, quota.unit, quota.partition, pooled)
                part.budgets[key] = budget
            budget.observe(quota, now, seq, costs.get(id(budget), 0.0), sent_at)
        stale = [
            key
            for key, budget in part.budgets.items()
            if budget.seen_at < now - self.forget_seconds
            and (budget.left is None or now >= budget.reset_at)
            and budget.in_flight == 0
        ]
        for key in stale:
            del part.budgets[key]

    def _refusal_wait(self, part: _Partition, seen: Observation, now: float) -> float:
        """How long a refused partition waits: ``Retry-After``, else the latest reset among
        the quotas the refusal says are spent, else (reactive) the backoff."""
        if seen.retry_after_seconds is not None:
            part.refusals = 0
            return seen.retry_after_seconds
        spent = [q for q in seen.quotas if _spent(q)]
        if spent:
            part.refusals = 0
            return max(q.reset_seconds or 0.0 for q in spent)
        part.refusals += 1
        self._stats["reactive"] += 1
        return self.retries.backoff(part.refusals)

    # --- reading ------------------------------------------------------------------------------

    def stats(self) -> dict[str, float]:
        """The counters (``STATS``): whole counts, and ``wait_seconds`` (a float) in all."""
        with self._lock:
            return dict(self._stats)

    def policies(self) -> list[LearnedPolicy]:
        """What has been learned, per server, partition and quota."""
        with self._lock:
            return [
                LearnedPolicy(server, name, b.name, b.unit, b.limit, b.window_seconds,
                              b.server_partition)
                for (server, name), part in self._parts.items()
                for b in part.budgets.values()
            ]  # fmt: skip


def _spent(quota: Quota) -> bool:
    return quota.remaining == 0 and quota.reset_seconds is not None


def _describe(budget: Budget, now: float) -> str:
    left_now = budget.left_now(now)
    left = "?" if left_now is None else f"{max(left_now, 0):.0f}"
    wait = budget.reset_at - now
    resets = f", resets in {_seconds(wait)} s" if math.isfinite(wait) else ""
    return f"quota {budget.name!r} ({left} {budget.unit} left{resets})"


def _seconds(value: float) -> str:
    """Seconds as a person reads them: ``0.25``, ``12.5``, ``3600``."""
    return f"{value:.3g}" if value < 1000 else f"{value:.0f}"
