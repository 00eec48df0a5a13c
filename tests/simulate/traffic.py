"""Generated access logs with known heavy hitters, for the simulate tests and benchmark."""

from __future__ import annotations

import random
from dataclasses import dataclass
from datetime import UTC, datetime


@dataclass(frozen=True, slots=True)
class Line:
    time: float
    ip: str
    user: str | None
    method: str
    path: str
    status: int

    def combined(self) -> str:
        when = datetime.fromtimestamp(self.time, UTC).strftime("%d/%b/%Y:%H:%M:%S +0000")
        return (
            f'{self.ip} - {self.user or "-"} [{when}] "{self.method} {self.path} HTTP/1.1" '
            f'{self.status} 512 "-" "test/1.0"\n'
        )


def generate(
    seconds: int = 600,
    normal: int = 60,
    heavy: int = 3,
    seed: int = 7,
    start: float = 1_700_000_000.0,
) -> list[Line]:
    """``normal`` clients at about one request in 20 s, ``heavy`` ones at about 3 per second
    (bursty), whole seconds only (the combined format has no fractions); some 304s."""
    rng = random.Random(seed)
    out = []
    for second in range(seconds):
        t = start + second
        for i in range(normal):
            if rng.random() < 0.05:
                out.append(_line(rng, t, f"10.0.0.{i}", f"u{i}"))
        for i in range(heavy):
            for _ in range(rng.choice((0, 1, 2, 3, 5, 8))):
                out.append(_line(rng, t, f"203.0.113.{i}", f"heavy{i}"))
    return out


def _line(rng: random.Random, t: float, ip: str, user: str) -> Line:
    method = "POST" if rng.random() < 0.2 else "GET"
    path = rng.choice(("/api/items", "/api/items/7", "/login", "/static/app.js"))
    status = 304 if method == "GET" and rng.random() < 0.1 else 200
    return Line(t, ip, user if rng.random() < 0.9 else None, method, path, status)
