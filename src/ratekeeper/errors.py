"""Every exception ratekeeper raises, in one tree.

    RatekeeperError
    ├── RateSpecError (also ValueError)      a rate string or cost that cannot be used
    ├── ConfigError (also ValueError)        an unknown algorithm, option or setting
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


class StoreUnavailable(RatekeeperError):
    """The store could not answer and the limiter was told not to fail open."""
