"""``Budget``: the client's view of one quota, and the pace it keeps under it (no I/O).

A budget is seeded by the first response that states the quota and corrected by every later
one: what the server says is the truth, the local count only fills the time between answers.

- **What is left**: a response's ``remaining`` less every unit still in flight (sent, not yet
  answered; the server may not have counted them yet) becomes ``left``; each request sent
  takes its cost from it. An answer to a request sent before the one last applied is stale
  and ignored (its ``remaining`` predates a newer count), but when it found more left than
  the newer answer, the server counted it first: it is given back, not taken off twice.
  Servers round the reset up to whole seconds (ratekeeper's ``t``, GitHub's epoch), so each
  answer is an upper bound of the reset: while ``remaining`` only falls (the same window),
  the earliest is kept. When ``left`` cannot cover a request, it waits for the reset; at
  the reset ``left`` is the limit less what is in flight, but one request goes alone until
  its answer confirms it (a bucket's reset is when it would be full had nothing been sent).
- **The pace**: when the quota's window is known (``RateLimit-Policy``'s ``w``), requests are
  spaced by a GCRA at ``headroom`` times the quota's rate with ``burst`` units of tolerance
  (by default the limit: in one process what is left may go at once, and what is left is
  what holds it back; ``burst=1`` spaces requests evenly: in any window of ``w`` seconds
  at most ``1 + headroom * limit``, which a fixed window, a token bucket and a GCRA all
  admit). Without a window, what is left is spread until the reset, ``burst`` at once.
  Token quotas are always spaced (a request's tokens are an estimate: the spacing leaves
  room for one that uses more).
- **Refilling quotas** (OpenAI's and Anthropic's: the reset is when the bucket is full
  again): the rate is learned from an answer (``(limit - remaining) / reset``), what is left
  grows at that rate, and the pace keeps ``headroom`` of it.
- **Shared with other processes** (``shared=``, a window's quota): no process sees the
  others' sends, so what is left is the last answer's ``remaining`` less the shared pace's
  rate since the answered request was sent (the most all processes can have sent since);
  it stops every process near a window the server says is fuller than the pace implies.
- **Tokens**: a budget whose unit is not ``requests`` is charged the request's declared cost
  (``tokens``); the server's next ``remaining`` corrects the estimate.

Timeline, ``"q";q=10;w=1`` seen with ``r=3;t=1`` at t=0, headroom 0.9 (interval 0.111 s),
one request in flight: left = 3 - 1 = 2; sends at 0.0 and 0.111 take it to 0; a third waits
for the reset at t=1, when left = 10 - (in flight).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from .headers import Quota

PROBE_SECONDS = 1.0
"""How long an exhausted quota whose reset nobody stated is waited out before trying again."""


@dataclass(frozen=True, slots=True)
class LearnedPolicy:
    """What the client has learned of one quota of one server and partition."""

    host: str
    partition: str
    name: str
    unit: str
    limit: int | None
    window_seconds: float | None
    server_partition: str | None = None


class Budget:
    """One quota's state (see the module): mutable, owned by one ``PacerCore`` under its lock."""

    __slots__ = (
        "accrued_at",
        "decay_from",
        "in_flight",
        "left",
        "limit",
        "name",
        "pooled",
        "rate_basis",
        "refill_per_second",
        "reset_at",
        "seen_at",
        "seen_remaining",
        "seen_seq",
        "server_partition",
        "tat",
        "unconfirmed",
        "unit",
        "window_seconds",
    )

    def __init__(
        self, name: str, unit: str, server_partition: str | None, pooled: float | None = None
    ) -> None:
        self.name = name
        self.pooled = pooled
        """The headroom of a pace shared with other processes (None: this process alone)."""
        self.decay_from = -math.inf
        self.unit = unit
        self.server_partition = server_partition
        self.limit: int | None = None
        self.window_seconds: float | None = None
        self.left: float | None = None
        """Units that may still be sent before ``reset_at`` (None: not known)."""
        self.reset_at = math.inf
        self.seen_seq = -1
        self.seen_remaining: int | None = None
        self.seen_at = -math.inf
        self.tat = -math.inf
        """The pace's theoretical arrival time (epoch seconds)."""
        self.in_flight = 0.0
        self.refill_per_second: float | None = None
        """A refilling quota's rate, learned from its answers (None: a window's quota)."""
        self.accrued_at = -math.inf
        self.unconfirmed = False
        """Past a reset nothing has answered yet: one request at a time until one does (a
        bucket's reset is when it would be full had nothing been sent since, so the limit
        is an assumption until an answer confirms it)."""
        self.rate_basis = (0.0, 0)
        """The reset (seconds) and limit the learned rate was computed from."""

    def cost_of(self, tokens: int, body_bytes: int) -> float:
        """What a request costs this quota: 1 request, its declared tokens or its body's
        bytes (``content-bytes``)."""
        if self.unit == "requests":
            return 1.0
        if self.unit == "content-bytes":
            return float(body_bytes)
        if self.unit == "concurrent-requests":
            return 1.0
        return float(tokens)

    def interval(self, headroom: float, now: float) -> float | None:
        """Seconds per unit of the pace, or None when there is none to keep."""
        if self.unit == "concurrent-requests":
            return None
        if self.limit and self.window_seconds:
            return self.window_seconds / (self.limit * headroom)
        if self.left is not None and self.left > 0 and math.isfinite(self.reset_at):
            return max(0.0, self.reset_at - now) / self.left
        return None

    def _decay(self) -> float | None:
        """Units a second that all processes sharing the pace may send (a window's quota with
        ``shared=``): what is left is then the last answer's ``remaining`` less that rate
        since the answered request was sent, as no process knows the others' sends."""
        if self.pooled is None or self.refill_per_second is not None:
            return None
        if not self.limit or not self.window_seconds or self.unit == "concurrent-requests":
            return None
        return self.pooled * self.limit / self.window_seconds

    def left_now(self, now: float) -> float | None:
        """What is left at ``now`` (see ``_decay``), or None: not known."""
        decay = self._decay()
        if self.left is None or decay is None:
            return self.left
        return self.left - decay * max(0.0, now - self.decay_from)

    def roll(self, now: float) -> None:
        """A refilling quota gains its rate's units since the last look (up to the limit);
        a window's quota, past its reset, has the limit less what is in flight (unknown
        without a limit), and the next reset is a window later when the window is known."""
        if self.left is None:
            return
        rate = self.refill_per_second
        if rate is not None and self.limit is not None:
            gained = rate * max(0.0, now - self.accrued_at)
            self.left = min(self.limit - self.in_flight, self.left + gained)
            self.accrued_at = max(self.accrued_at, now)
            return
        if now < self.reset_at:
            return
        if self.limit is None:
            self.left, self.reset_at = None, math.inf
            return
        if self._decay() is not None:
            self.left, self.decay_from = float(self.limit), self.reset_at
        else:
            self.left = self.limit - self.in_flight
        self.unconfirmed = True
        if not self.window_seconds:
            self.tat = -math.inf  # a spread is over its window: the next starts afresh
        step = self.window_seconds
        self.reset_at = self.reset_at + step if step else math.inf
        if self.reset_at <= now:
            self.reset_at = now + step if step else math.inf

    def delay(self, cost: float, now: float, headroom: float, burst: int | None) -> float:
        """Seconds until a request of ``cost`` may be sent (0: now; ``math.inf``: unknown)."""
        self.roll(now)
        if self.unit == "concurrent-requests":
            if self.limit is not None and self.in_flight + 1 > self.limit:
                return PROBE_SECONDS / 10  # a slot frees when an answer comes
            return 0.0
        if self.unconfirmed and self.in_flight > 0:
            return PROBE_SECONDS / 200  # the first answer past the reset is awaited
        left = self.left_now(now)
        if left is not None:
            need = min(cost, self.limit) if self.limit is not None else cost
            if left < need or left <= 0:
                rate = self.refill_per_second
                if rate:
                    return max((max(need, 1e-9) - left) / rate, 1e-3)
                if math.isfinite(self.reset_at):
                    return max(self.reset_at - now, 1e-3)
                return PROBE_SECONDS
        step = self.interval(headroom, now)
        if step is None:
            return 0.0
        if self.unit != "requests":  # estimates: spaced, so a request using more has room
            allowance = max(cost, 1.0) * step
        elif burst is None:  # the whole limit may go at once; what is left holds it back
            allowance = max(float(self.limit or 1), cost) * step
        else:
            allowance = max(burst, cost) * step
        return max(0.0, max(self.tat, now) + cost * step - allowance - now)

    def take(self, cost: float, now: float, headroom: float) -> None:
        """A request of ``cost`` is sent now."""
        if self.left is not None and self._decay() is None:
            self.left -= cost
        step = self.interval(headroom, now)
        if step is not None:
            self.tat = max(self.tat, now) + cost * step
        self.in_flight += cost

    def untake(self, cost: float) -> None:
        """A request of ``cost`` that was taken is not sent after all (still in flight until
        ``answered``)."""
        if self.left is not None and self._decay() is None:
            self.left += cost

    def answered(self, cost: float) -> None:
        """A request of ``cost`` has its answer (or failed): it is no longer in flight."""
        self.in_flight = max(0.0, self.in_flight - cost)

    def observe(
        self, quota: Quota, now: float, seq: int, cost: float = 0.0, sent_at: float | None = None
    ) -> None:
        """A response to the request sent as number ``seq`` (of ``cost`` here, at
        ``sent_at``) states this quota (its own cost is no longer in flight: ``answered``
        first)."""
        self.seen_at = now
        if quota.limit is not None:
            self.limit = quota.limit
        if quota.window_seconds is not None:
            self.window_seconds = quota.window_seconds
        if quota.refills and quota.window_seconds is None:
            self._learn_rate(quota)
        if quota.remaining is None:
            return
        if seq < self.seen_seq:
            # a stale answer; if it found more left than the newer one, the server counted it
            # first, so the newer count holds it and it was taken off twice (as in flight)
            seen = self.seen_remaining
            counted = seen is not None and quota.remaining > seen
            if counted and self.left is not None and self._decay() is None:
                self.left += cost
            return
        if quota.reset_seconds is not None:
            reset_at = now + quota.reset_seconds
        else:
            reset_at = now + (self.window_seconds or PROBE_SECONDS)
        if (
            self.refill_per_second is None
            and self.seen_remaining is not None
            and quota.remaining <= self.seen_remaining
            and now < self.reset_at < reset_at
        ):
            reset_at = self.reset_at  # the same window: the earliest of its upper bounds
        if self._decay() is not None:
            self.left = float(quota.remaining)
            self.decay_from = now if sent_at is None else sent_at
        else:
            self.left = quota.remaining - self.in_flight
        new_window = self.seen_remaining is not None and quota.remaining > self.seen_remaining
        if new_window and not self.window_seconds:
            self.tat = -math.inf  # a spread is over its window: the next starts afresh
        self.reset_at = reset_at
        self.seen_seq = seq
        self.seen_remaining = quota.remaining
        self.accrued_at = now
        self.unconfirmed = False

    def _learn_rate(self, quota: Quota) -> None:
        """A refilling quota's rate from one answer: the units missing over the seconds until
        full (OpenAI's resets are rounded to the millisecond, so the answer with the longest
        reset gives the finest estimate and is kept); its window, limit / rate, to two
        significant digits (60 s, not 59.97: the shared pace is keyed by it)."""
        limit, remaining, reset = quota.limit, quota.remaining, quota.reset_seconds
        if limit is None or remaining is None or reset is None or reset <= 0:
            return
        if remaining >= limit:
            return
        if reset < self.rate_basis[0] and limit == self.rate_basis[1]:
            return  # a shorter reset is rounded more coarsely: keep the finer estimate
        window = _two_digits(limit * reset / (limit - remaining))
        self.refill_per_second = limit / window
        self.window_seconds = window
        self.rate_basis = (reset, limit)


def _two_digits(seconds: float) -> float:
    """``seconds`` to two significant digits (at least 1 ms)."""
    if seconds <= 0.001:
        return 0.001
    return float(f"{seconds:.2g}")
