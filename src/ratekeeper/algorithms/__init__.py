"""The algorithm registry: a plain dict from name to module (see ``base`` for the contract)."""

from __future__ import annotations

from . import fixed_window, gcra, sliding_log, sliding_window, token_bucket
from .base import Algorithm, Limit, Outcome

ALGORITHMS: dict[str, Algorithm] = {
    m.NAME: m for m in (fixed_window, token_bucket, sliding_window, sliding_log, gcra)
}

__all__ = ["ALGORITHMS", "Algorithm", "Limit", "Outcome"]
