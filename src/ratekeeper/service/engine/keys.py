"""The keys the engine gives the store (``store_key``, ``envoy_key``) and the opaque lease
tokens it gives clients (``lease_token``, ``parse_lease_token``)."""

from __future__ import annotations

import base64
import binascii
import json
from collections.abc import Sequence

from ...errors import BadRequest


def store_key(name: str, key: str) -> str:
    """The key the limiter sees: injective in (policy name, caller key)."""
    return f"{len(name)}:{name}:{key}"


def envoy_key(domain: str, entries: Sequence[tuple[str, str]]) -> str:
    """An Envoy descriptor's counter key: injective in (domain, entries), every part length-
    prefixed (``[4:edge|2:ip7:1.2.3.4``); it starts with ``[``, so it never equals a
    ``store_key`` (which starts with a digit)."""
    if len(entries) == 1:
        ((k, v),) = entries
        return f"[{len(domain)}:{domain}|{len(k)}:{k}{len(v)}:{v}"
    return f"[{len(domain)}:{domain}" + "".join(f"|{len(k)}:{k}{len(v)}:{v}" for k, v in entries)


def lease_token(name: str, key: str, lease_id: str) -> str:
    """The opaque token a client releases a lease with (see the module docstring)."""
    raw = json.dumps([name, key, lease_id], separators=(",", ":"), ensure_ascii=False)
    return base64.urlsafe_b64encode(raw.encode("utf-8")).rstrip(b"=").decode("ascii")


def parse_lease_token(token: object) -> tuple[str, str, str]:
    """(policy, key, lease id) from a token, or ``BadRequest`` naming the ``lease`` field: 400
    for what is not a non-empty string, 404 for a string that is no token of ours (no such
    lease: the request was well formed, the lease it names does not exist)."""
    if not isinstance(token, str) or not token:
        raise BadRequest("lease", f"lease {token!r} is invalid; expected a token from acquire")
    bad = BadRequest(
        "lease",
        f"lease {token[:80]!r} was not issued by this service; expected a token from acquire",
        404,
    )
    if not token.isascii():
        raise bad
    try:
        raw = base64.urlsafe_b64decode(token + "=" * (-len(token) % 4))
        value = json.loads(raw.decode("utf-8"))
    except (ValueError, binascii.Error, UnicodeDecodeError):
        raise bad from None
    if (
        not isinstance(value, list)
        or len(value) != 3
        or not all(isinstance(v, str) for v in value)
        or not value[0]
        or not value[1]
    ):
        raise bad
    return value[0], value[1], value[2]
