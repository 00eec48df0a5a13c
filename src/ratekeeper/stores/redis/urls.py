"""Redis URLs: checking them, naming a server by one, and keeping their secrets out of messages.

A URL may carry a user and password (``redis://user:secret@host``) and TLS options in its
query (``rediss://host?ssl_ca_certs=...``). Generated passwords hold any character, and one
with ``/``, ``?`` or ``#`` that is not percent-encoded breaks a standard URL parser: the
password becomes a "port" or a "path", which the parser then quotes in its error. So this
module finds the userinfo itself (``userinfo``): everything between ``//`` and the last
``@`` (a host never holds one), whatever it contains.

- ``redact`` shows the userinfo as ``user:***`` (``***`` when it has no ``:``: a lone
  token) and the values of query parameters named like secrets as ``***``. Every message,
  ``repr`` and log line that shows a URL shows ``redact(url)``.
- ``check_url`` refuses a userinfo with ``/``, ``?`` or ``#`` (percent-encoded, they mean
  what they say), then checks the rest with the standard parser, and its options by making
  (not connecting) a redis-py connection of it. The config reader and the stores call it
  alike, so ``check-config`` refuses what ``serve`` refuses.
"""

from __future__ import annotations

import re
from urllib.parse import quote, unquote, urlsplit

from redis import ConnectionPool, RedisError
from redis.connection import parse_url

from ...errors import ConfigError

_SCHEMES = ("redis", "rediss", "unix")
_SECRET_PARAM = re.compile(r"((?:^|&)[^=&]*(?:password|passwd|secret|token)[^=&]*=)[^&]*", re.I)
_EXPECTED = "expected redis://host:port/db, rediss://host:port/db or unix:///path.sock"


def userinfo(url: str) -> tuple[str, str | None, str]:
    """``url`` as the text up to and with ``//``, its userinfo (None when it has none) and
    the text after the userinfo's ``@``."""
    head, sep, rest = url.partition("//")
    at = rest.rfind("@")
    if not sep or at < 0:
        return url, None, ""
    return head + sep, rest[:at], rest[at + 1 :]


def redact(url: object) -> str:
    """``url`` with its password (or token) and secret-looking query values as ``***``."""
    if isinstance(url, bytes):
        url = url.decode("latin-1")
    if not isinstance(url, str):
        return (
            repr(url)
            if url is None or isinstance(url, int | float)
            else f"<a {type(url).__name__}>"
        )
    head, user, rest = userinfo(url)
    if user is None:
        head, sep, rest = url.partition("//")
        head += sep
        shown = ""
    else:
        name, colon, _ = user.partition(":")
        shown = f"{name}:***@" if colon else "***@"
    where, mark, query = rest.partition("?")
    if mark:
        rest = where + mark + _SECRET_PARAM.sub(r"\1***", query)
    return head + shown + rest


def scrub(text: str, url: str) -> str:
    """``text`` (say, a driver's message about ``url``) with ``url``'s secrets as ``***``."""
    _, user, rest = userinfo(url)
    secrets: set[str] = set()
    if user is not None:
        name, colon, password = user.partition(":")
        secrets.add(password if colon else name)
    for match in _SECRET_PARAM.finditer(rest.partition("?")[2]):
        secrets.add(rest.partition("?")[2][match.end(1) : match.end()])
    text = text.replace(url, redact(url))
    for secret in sorted(secrets, key=len, reverse=True):
        plain = unquote(secret)
        for form in (secret, plain, quote(plain, safe="")):
            if form:
                text = text.replace(form, "***")
    return text


def check_url(url: object, what: str = "url", host: bool = True, cluster: bool = False) -> str:
    """A Redis URL: ``redis://`` or ``rediss://`` with a host (port, db optional), or
    ``unix://`` (module docstring). ``host=False``: the URL of servers Sentinel finds,
    credentials, database and options without a host; ``cluster``: a cluster's (no socket
    path; options its client reads)."""
    shown = repr(redact(url))
    if not isinstance(url, str) or not url:
        raise ConfigError(f"{what} {shown} is invalid; {_EXPECTED}")
    _, user, _ = userinfo(url)
    if user is not None and any(c in user for c in "/?#"):
        raise ConfigError(
            f"{what} {shown} has '/', '?' or '#' before its last '@': percent-encode them in "
            "the user name and password (%2F, %3F, %23), and an '@' after the host (%40)"
        )
    try:
        parts = urlsplit(url)
    except ValueError:  # e.g. a bracket in the host
        raise ConfigError(f"{what} {shown} is invalid; {_EXPECTED}") from None
    try:
        port = parts.port  # parsed lazily: a bad port raises here
    except ValueError:
        raise ConfigError(f"{what} {shown} has an invalid port; {_EXPECTED}") from None
    if parts.scheme not in _SCHEMES:
        raise ConfigError(f"{what} {shown} has scheme {parts.scheme!r}; {_EXPECTED}")
    if not host:
        if parts.scheme == "unix" or parts.hostname or port:
            raise ConfigError(
                f"{what} {shown} is invalid; expected credentials, database and TLS options "
                "without a host (Sentinel names it), e.g. 'redis://:secret@/0'"
            )
    elif parts.scheme == "unix":
        if cluster:
            raise ConfigError(f"{what} {shown} is a unix socket; expected redis://host")
        if not parts.path:
            raise ConfigError(f"{what} {shown} has no socket path; {_EXPECTED}")
    elif not parts.hostname:
        raise ConfigError(f"{what} {shown} has no host; {_EXPECTED}")
    db = parts.path.strip("/") if parts.scheme != "unix" else ""
    if db and not db.isdigit():
        raise ConfigError(f"{what} {shown} has database {db!r}; expected a number, e.g. /0")
    _check_options(url, what, shown, connection=not cluster)
    return url


def _check_options(url: str, what: str, shown: str, connection: bool) -> None:
    """The query's options as redis-py reads them, and (``connection``) as a connection of
    the URL takes them: a connection object is made, as the store will make it, without
    connecting (an unknown option or a bad value raises there, not at the first request).
    redis-py's message is scrubbed of secrets."""
    try:
        if connection:
            ConnectionPool.from_url(url).make_connection()
        else:
            parse_url(url)  # type: ignore[no-untyped-call]  # untyped in redis-py
    except (ValueError, TypeError, RedisError) as exc:
        raise ConfigError(f"{what} {shown} is invalid: {scrub(str(exc), url)}") from None


def address(url: str) -> str:
    """``host:port/db`` (or the socket path) of a URL: a shard's default name, no credentials."""
    parts = urlsplit(url)
    if parts.scheme == "unix":
        return parts.path
    db = parts.path.strip("/") or "0"
    return f"{parts.hostname}:{parts.port or 6379}/{db}"
