"""A server as a function, for driving ``Pacer.run`` without sockets (the pacing rules)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from ratekeeper import ManualClock
from ratekeeper.client import Answer, Pacer, outgoing

URL = "https://api.example.com/v1/items"


@dataclass
class Fake:
    """Answers each request with ``reply(n, headers)``; records when each was sent."""

    clock: ManualClock
    reply: Callable[[int, dict[str, str]], tuple[int, dict[str, str]]]
    sent: list[float] = field(default_factory=list)

    def send(self, headers: dict[str, str]) -> Answer:
        self.sent.append(self.clock())
        status, out = self.reply(len(self.sent), headers)
        return Answer(status, {k.lower(): v for k, v in out.items()})


def pacer(clock: ManualClock, **options: object) -> Pacer:
    return Pacer(clock=clock, sleep=clock.advance, random=lambda: 0.5, **options)  # type: ignore[arg-type]


def call(
    p: Pacer, server: Fake, method: str = "GET", headers: dict[str, str] | None = None,
    url: str = URL, replayable: bool = True,
) -> Answer:  # fmt: skip
    headers = dict(headers or {})
    request = outgoing(method, url, headers.items(), replayable=replayable)
    return p.run(request, lambda: server.send(headers), lambda a: a, lambda a: None)
