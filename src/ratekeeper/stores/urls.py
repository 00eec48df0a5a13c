"""Redis URLs: checking them, naming a server by one, and keeping their secrets out of messages.

A URL may carry a password (``redis://user:secret@host``) and TLS options in its query
(``rediss://host?ssl_ca_certs=...``). Every message, ``repr`` and log line that shows a URL
shows ``redact(url)``: the password (or a lone token in the user part) and the values of query
parameters named like secrets become ``***``.
"""

from __future__ import annotations

import re
from urllib.parse import unquote, urlsplit, urlunsplit

from ..errors import ConfigError

_SCHEMES = ("redis", "rediss", "unix")
_SECRET_PARAM = re.compile(r"((?:^|&)[^=&]*(?:password|passwd|secret|token)[^=&]*=)[^&]*", re.I)


def redact(url: object) -> str:
    """``url`` with its password (or token) and secret-looking query values as ``***``."""
    if not isinstance(url, str):
        return repr(url)
    try:
        parts = urlsplit(url)
    except ValueError:
        return "<a URL that cannot be parsed>"
    netloc = parts.netloc
    if "@" in netloc:
        user, _, where = netloc.rpartition("@")
        name, colon, _secret = user.partition(":")
        netloc = f"{name}:***@{where}" if colon else f"***@{where}"
    query = _SECRET_PARAM.sub(r"\1***", parts.query)
    return urlunsplit((parts.scheme, netloc, parts.path, query, parts.fragment))


def scrub(text: str, url: str) -> str:
    """``text`` (say, a driver's message about ``url``) with ``url``'s secrets as ``***``."""
    try:
        parts = urlsplit(url)
    except ValueError:
        return text
    secret = parts.password if parts.password is not None else parts.username
    if secret:
        text = text.replace(secret, "***").replace(unquote(secret), "***")
    return text.replace(url, redact(url))


def check_url(url: object, what: str = "url") -> str:
    """A Redis URL: ``redis://`` or ``rediss://`` with a host (port, db optional), or ``unix://``."""
    expected = "expected redis://host:port/db, rediss://host:port/db or unix:///path.sock"
    shown = repr(redact(url)) if isinstance(url, str) else repr(url)
    if not isinstance(url, str) or not url:
        raise ConfigError(f"{what} {shown} is invalid; {expected}")
    try:
        parts = urlsplit(url)
    except ValueError:
        raise ConfigError(f"{what} {shown} is invalid; {expected}") from None
    if parts.scheme not in _SCHEMES:
        raise ConfigError(f"{what} {shown} has scheme {parts.scheme!r}; {expected}")
    if parts.scheme == "unix":
        if not parts.path:
            raise ConfigError(f"{what} {shown} has no socket path; {expected}")
        return url
    try:
        _ = parts.port  # parsed lazily: a bad port raises here
    except ValueError:
        raise ConfigError(f"{what} {shown} has an invalid port; {expected}") from None
    if not parts.hostname:
        raise ConfigError(f"{what} {shown} has no host; {expected}")
    db = parts.path.strip("/")
    if db and not db.isdigit():
        raise ConfigError(f"{what} {shown} has database {db!r}; expected a number, e.g. /0")
    return url


def address(url: str) -> str:
    """``host:port/db`` (or the socket path) of a URL: a shard's default name, no credentials."""
    parts = urlsplit(url)
    if parts.scheme == "unix":
        return parts.path
    db = parts.path.strip("/") or "0"
    return f"{parts.hostname}:{parts.port or 6379}/{db}"
