"""Bearer tokens compared in constant time (the HTTP API's and the gRPC API's)."""

from __future__ import annotations

import hmac


def check_bearer(given: str, expected: str) -> bool:
    """Constant-time token check (shared with the gRPC API)."""
    return _same(given.encode("latin-1", "replace"), expected)


def _same(given: bytes, expected: str) -> bool:
    return bool(expected) and hmac.compare_digest(given, expected.encode())
