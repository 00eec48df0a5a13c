"""Redis key layout: ``{prefix}{{{tag}}}{slot}``, e.g. ``rk{user:42}f:5000/1h``.

- ``prefix`` (default ``rk``) namespaces ratekeeper; it may not contain braces.
- ``tag`` encodes the caller's key and is the Redis Cluster hash tag, so every rate of a stack
  (and every store op on one caller key) lands in one slot and one script sees them all.
  It is injective: ``%``, ``{`` and ``}`` are percent-escaped (so the tag never holds a ``}``
  and can never end early), and a leading ``#`` is escaped too, because a tag starting with
  ``#`` means "hashed": caller keys over 200 UTF-8 bytes become ``#`` + their SHA-256 hex, so a
  10 kB key costs 65 bytes of key name. Two distinct keys share a tag only if SHA-256 collides.
  A lone surrogate (U+D800..U+DFFF, e.g. from ``surrogateescape``-decoded bytes) becomes
  ``%uD800``-style text: it cannot be sent as UTF-8, and must not turn a caller key into a
  store failure (which would fail open and count towards opening the circuit breaker).
- ``slot`` names the state: algorithm code, state-shaping option, rate (``Policy.slots``).
"""

from __future__ import annotations

import hashlib
import re
from functools import lru_cache

from ...errors import ConfigError

MAX_PLAIN_BYTES = 200
_SURROGATE = re.compile("[\ud800-\udfff]")


def _escape_surrogate(match: re.Match[str]) -> str:
    return f"%u{ord(match.group()):04X}"


def check_prefix(prefix: str) -> str:
    """A prefix is a short string without braces (braces would move the hash tag)."""
    if not isinstance(prefix, str) or "{" in prefix or "}" in prefix or len(prefix) > 64:
        raise ConfigError(f"prefix {prefix!r} is invalid; expected up to 64 characters, no braces")
    return prefix


@lru_cache(maxsize=65536)
def encode_tag(key: str) -> str:
    """The hash-tag text for a caller key (see the module docstring)."""
    tag = key.replace("%", "%25").replace("{", "%7B").replace("}", "%7D")
    if tag.startswith("#"):
        tag = "%23" + tag[1:]
    if not tag.isascii():
        tag = _SURROGATE.sub(_escape_surrogate, tag)
    if len(tag.encode("utf-8", "surrogatepass")) > MAX_PLAIN_BYTES:
        return "#" + hashlib.sha256(key.encode("utf-8", "surrogatepass")).hexdigest()
    return tag


def redis_key(prefix: str, key: str, slot: str) -> str:
    """The full Redis key for one rate's state of one caller key."""
    return f"{prefix}{{{encode_tag(key)}}}{slot}"
