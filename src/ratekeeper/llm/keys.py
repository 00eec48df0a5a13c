"""Who a caller is: the API key a client sends, and a table of keys to callers.

The OpenAI SDK sends its key as ``Authorization: Bearer <key>``, the Anthropic SDK as
``x-api-key: <key>``; ``api_key(request)`` reads either (the bearer first). ``callers(table)``
is an ``identify`` for a gateway from a mapping of key to ``Caller`` (your records; a
function or a database lookup serves as well): an unknown key is None, a 401.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

from ..middleware.request import RequestInfo
from .limits import Caller


def api_key(request: RequestInfo) -> str | None:
    """The client's API key: ``Authorization: Bearer <key>``, else ``x-api-key``."""
    auth = request.header("authorization")
    if auth is not None:
        scheme, _, token = auth.strip().partition(" ")
        if scheme.lower() == "bearer" and token.strip():
            return token.strip()
    key = request.header("x-api-key")
    return key.strip() or None if key is not None else None


def callers(table: Mapping[str, Caller]) -> Callable[[RequestInfo], Caller | None]:
    """An ``identify`` looking the request's API key up in ``table``."""

    def identify(request: RequestInfo) -> Caller | None:
        key = api_key(request)
        return None if key is None else table.get(key)

    return identify
