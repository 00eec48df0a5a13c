"""The application's functions (key, rate, cost, priority, ``charge_when``) as the gate calls
them: an exception from one is a ``UserFunctionError``, which the gate logs once per function,
counts, and raises only with ``on_error="raise"``."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from ..errors import ConfigError

ON_ERROR = ("open", "raise")
"""What an error in the application's functions does: let the request through (counted,
logged once per function), or raise out of the middleware (tests)."""


class UserFunctionError(Exception):
    """One of the application's functions (``kind``: one of ``metrics.vocabulary.FUNCTIONS``)
    raised ``__cause__``, or returned ``value`` that is no key, rate or cost."""

    def __init__(self, function: object, kind: str, exc: Exception) -> None:
        super().__init__(f"the {kind} function {function!r} raised {exc!r}")
        self.function = function
        self.kind = kind
        self.exc = exc


def check_on_error(on_error: object, where: str = "on_error") -> str:
    """``on_error`` is ``"open"`` or ``"raise"``."""
    if on_error not in ON_ERROR:
        raise ConfigError(f"{where}={on_error!r} is invalid; expected 'open' or 'raise'")
    return str(on_error)


def call(function: Callable[[Any], Any], arg: Any, kind: str) -> Any:
    """``function(arg)``; an exception from it is a ``UserFunctionError``."""
    try:
        return function(arg)
    except Exception as exc:
        raise UserFunctionError(function, kind, exc) from exc
