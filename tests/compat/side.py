"""Running one app twice — under the peer and under ratekeeper's port — with the same requests,
and comparing what each answered.

A run builds the app afresh (new counters: a fresh process, or an emptied Redis) and sends the
requests in order. The peers keep time themselves (limits' windows start at a key's first hit,
like ratekeeper's), so a run on a slow machine could straddle a window's end that the other did
not: a run taking longer than ``BUDGET`` seconds is repeated, and only a difference seen in runs
that kept within it counts.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]

BUDGET = 0.7
"""Seconds a run may take: the shortest window of the samples is one second."""


@dataclass(frozen=True)
class Answer:
    """What one request got: its status, and its body when the port restores the peer's."""

    status: int
    body: str | None = None


Run = Callable[[bool], tuple[list[Answer], float]]
"""A run of the requests: ``run(peer)`` builds the app (the peer's, or ours), sends them, and
returns the answers and the seconds the requests took (from the first to the last)."""


def side_by_side(
    run: Run, attempts: int = 4, budget: float = BUDGET
) -> tuple[list[Answer], list[Answer]]:
    """The peer's answers and ours, from runs that each kept within ``budget`` seconds (the
    shortest window of the app's limits, less a margin)."""
    got: dict[bool, list[Answer]] = {}
    for _ in range(attempts):
        for peer in (True, False):
            answers, seconds = run(peer)
            if seconds <= budget:
                got[peer] = answers
        if len(got) == 2 and got[True] == got[False]:
            break
    assert len(got) == 2, "no run kept within the budget: the machine is too loaded"
    return got[True], got[False]


def statuses(answers: list[Answer]) -> list[int]:
    return [a.status for a in answers]


def namespace(source: str, name: str) -> dict[str, Any]:
    """``source`` run as a module named ``name``: its globals (the app among them)."""
    ns: dict[str, Any] = {"__name__": name}
    exec(compile(source, f"<{name}>", "exec"), ns)
    return ns


class Clock:
    """Seconds from the first request to the last of a run."""

    def __init__(self) -> None:
        self.first = self.last = 0.0

    def tick(self) -> None:
        now = time.monotonic()
        self.first = self.first or now
        self.last = now

    @property
    def seconds(self) -> float:
        return self.last - self.first
