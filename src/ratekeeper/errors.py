"""Every exception ratekeeper raises, in one tree.

    RatekeeperError
    ├── RateSpecError (also ValueError)      a rate string or cost that cannot be used
    ├── ConfigError (also ValueError)        an unknown algorithm, option or setting
    ├── BadRequest (also ValueError)         a service request that cannot be served (4xx)
    ├── LogOrderError                        simulate cannot put a log in time order as asked
    └── StoreUnavailable                     the store failed and the limiter fails closed

Being over the limit is a ``Decision``, never an exception. Driver errors are wrapped at
the store edge with ``raise StoreUnavailable(...) from exc``.
"""

from __future__ import annotations


class RatekeeperError(Exception):
    """Base class of every error ratekeeper raises on purpose."""


class RateSpecError(RatekeeperError, ValueError):
    """A rate such as ``"100/minute"`` (or a cost) could not be understood."""


class ConfigError(RatekeeperError, ValueError):
    """An algorithm name, option or setting is unknown or out of range."""


class LogOrderError(RatekeeperError):
    """``ratekeeper simulate`` cannot replay a log in time order as asked (``--late
    refuse``, or no room to sort it): nothing is reported; the message names the fixes."""


class StoreUnavailable(RatekeeperError):
    """The store could not answer and the limiter was told not to fail open."""


class NotSent(StoreUnavailable):
    """The store did not run the call: no connection, a connection lost before any reply, or a
    cluster node's ``MOVED``/``ASK`` redirect. Safe to send again (the cluster batcher does)."""


class BadRequest(RatekeeperError, ValueError):
    """A service request was refused before anything was counted.

    ``field`` names the part of the request at fault (``"key"``, ``"body"``, ...) and
    ``status`` is the HTTP status the service answers with (400, 404, 413, ...).
    """

    def __init__(self, field: str, message: str, status: int = 400) -> None:
        super().__init__(message)
        self.field = field
        self.status = status
