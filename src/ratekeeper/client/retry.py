"""Retries that cannot storm: which refusals are sent again, when, and how many in all.

A refused request (429, or 503 with ``Retry-After``) is sent again only if

- its method is idempotent (RFC 9110 9.2.2: GET, HEAD, OPTIONS, TRACE, PUT, DELETE) or it
  carries an ``Idempotency-Key``, and its body can be sent again;
- it has attempts left (``attempts`` counts the first send);
- the ``RetryBudget`` has a retry to give. The budget is gRPC's retry throttling: a bucket of
  ``max_tokens`` (default 10) tokens; every refusal takes one, every answer that is no
  refusal gives back ``token_ratio`` (0.1); retries are allowed only while more than half
  the bucket is left. So when most answers are refusals, retries stop — at most about one
  retry per ten successes in the long run — and they resume as answers succeed.

When: never before the server's ``Retry-After`` (or the learned reset, or for a 429 that says
nothing, ``backoff_seconds * 2**n`` up to ``max_backoff_seconds``), plus a random
``jitter`` fraction of that wait, so that callers refused together do not come back together.
"""

from __future__ import annotations

import threading
from collections.abc import Collection
from dataclasses import dataclass, field

from ..errors import ConfigError

IDEMPOTENT = frozenset({"GET", "HEAD", "OPTIONS", "TRACE", "PUT", "DELETE"})


class RetryBudget:
    """gRPC-style retry throttling (see the module); thread-safe."""

    __slots__ = ("_lock", "max_tokens", "token_ratio", "tokens")

    def __init__(self, max_tokens: float = 10.0, token_ratio: float = 0.1) -> None:
        if not isinstance(max_tokens, int | float) or isinstance(max_tokens, bool):
            raise ConfigError(f"max_tokens={max_tokens!r} is invalid; expected a number >= 1")
        if not 1 <= max_tokens <= 1000:
            raise ConfigError(f"max_tokens={max_tokens!r} is invalid; expected 1 to 1000")
        if not isinstance(token_ratio, int | float) or not 0 < token_ratio <= 1:
            raise ConfigError(f"token_ratio={token_ratio!r} is invalid; expected 0 < ratio <= 1")
        self.max_tokens = float(max_tokens)
        self.token_ratio = float(token_ratio)
        self.tokens = float(max_tokens)
        self._lock = threading.Lock()

    def refused(self) -> bool:
        """A refusal came back: take a token; True if a retry is allowed."""
        with self._lock:
            self.tokens = max(0.0, self.tokens - 1)
            return self.tokens > self.max_tokens / 2

    def succeeded(self) -> None:
        """An answer that is no refusal came back."""
        with self._lock:
            self.tokens = min(self.max_tokens, self.tokens + self.token_ratio)


def _positive(name: str, value: object, high: float) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or not 0 <= value <= high:
        raise ConfigError(f"{name}={value!r} is invalid; expected seconds, 0 to {high}")
    return float(value)


@dataclass(frozen=True, slots=True)
class Retries:
    """Which refused requests are sent again (see the module). ``Retries(attempts=1)`` never
    retries; ``budget`` is shared by every request of the pacer."""

    attempts: int = 3
    statuses: Collection[int] = (429, 503)
    methods: Collection[str] = IDEMPOTENT
    backoff_seconds: float = 1.0
    max_backoff_seconds: float = 60.0
    jitter: float = 0.2
    budget: RetryBudget = field(default_factory=RetryBudget)

    def __post_init__(self) -> None:
        if isinstance(self.attempts, bool) or not isinstance(self.attempts, int):
            raise ConfigError(f"attempts={self.attempts!r} is invalid; expected 1 to 10")
        if not 1 <= self.attempts <= 10:
            raise ConfigError(f"attempts={self.attempts!r} is invalid; expected 1 to 10")
        bad = [s for s in self.statuses if s not in (429, 503)]
        if bad:
            raise ConfigError(f"statuses={bad!r} cannot be retried; expected 429 and/or 503")
        _positive("backoff_seconds", self.backoff_seconds, 3600)
        _positive("max_backoff_seconds", self.max_backoff_seconds, 86400)
        _positive("jitter", self.jitter, 1.0)
        if not isinstance(self.budget, RetryBudget):
            raise ConfigError(f"budget={self.budget!r} is invalid; expected a RetryBudget")
        object.__setattr__(self, "methods", frozenset(m.upper() for m in self.methods))
        object.__setattr__(self, "statuses", frozenset(self.statuses))

    def may_retry(self, method: str, idempotency_key: bool, replayable: bool) -> bool:
        """Whether a request of this kind may ever be sent again."""
        return replayable and (method.upper() in self.methods or idempotency_key)

    def backoff(self, refusals: int) -> float:
        """The wait after the ``refusals``-th refusal in a row that stated no time."""
        return float(
            min(self.max_backoff_seconds, self.backoff_seconds * 2 ** max(0, refusals - 1))
        )
