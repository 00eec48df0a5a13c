"""The client's one exception: a wait that would pass ``max_wait``.

RatekeeperError (ratekeeper.errors)
├── ConfigError                         a bad option, request header or partition function
└── WaitTooLong                         the budget would come back after max_wait
"""

from __future__ import annotations

from ..errors import RatekeeperError


class WaitTooLong(RatekeeperError):
    """A request was not sent: its budget would come back only after its ``max_wait``.

    Raised when the pacer's ``on_max_wait`` is ``"raise"`` (the default); ``wait_seconds`` is
    the wait it would have needed (``math.inf``: not known), ``reason`` what it waits for.
    """

    def __init__(
        self, server: str, partition: str, wait_seconds: float, max_wait: float, reason: str
    ) -> None:
        self.server = server
        self.partition = partition
        self.wait_seconds = wait_seconds
        self.max_wait = max_wait
        self.reason = reason
        where = server + (f" [{partition}]" if partition else "")
        super().__init__(
            f"{where}: the request would wait {_seconds(wait_seconds)} s for {reason}, more than "
            f"max_wait={max_wait:g} s; not sent"
        )


def _seconds(value: float) -> str:
    return f"{value:.3g}" if value < 1000 else f"{value:.0f}"
