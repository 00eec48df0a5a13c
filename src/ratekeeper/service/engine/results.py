"""What the engine answers: a decision as the service reports it (``Result``) and a lease
request's answer (``LeaseResult``)."""

from __future__ import annotations

from dataclasses import dataclass
from functools import partial
from typing import NamedTuple

from ...decision import Decision


class Result(NamedTuple):
    """A decision as the service reports it (a named tuple: one is built per decision, and a
    frozen dataclass costs several times more to build)."""

    decision: Decision
    policy: str
    shadow: bool = False
    """A shadow policy would have rejected this request (it was answered allowed)."""
    local: bool = False
    """Answered by the over-limit cache without asking the store."""


_result = partial(tuple.__new__, Result)
"""``Result(*fields)`` without the named tuple's Python ``__new__`` (the hot path)."""


@dataclass(frozen=True, slots=True)
class LeaseResult:
    """The answer to a lease request of a concurrency policy."""

    acquired: bool
    lease: str | None
    """The token to release with; None when not acquired."""
    limit: int
    in_use: int | None
    """Live leases of the key after the call; None when the store was not asked."""
    expires_at: float | None
    policy: str
    degraded: bool = False
    shadow: bool = False
    """A shadow policy was full (the request was answered acquired, holding nothing)."""
