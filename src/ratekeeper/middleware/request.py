"""What a check may know about a request, and the built-in functions that read it.

``RequestInfo`` is built once per request from an ASGI scope (``from_scope``) or a WSGI environ
(``from_environ``) — the only code here that knows the two shapes. Everything else is a pure
function of ``RequestInfo``, shared by both middlewares:

- key functions (``KeyFunc``: request -> key, or None to skip the check for this request):
  ``client_ip`` (honouring ``X-Forwarded-For`` only from trusted proxies: the middleware's
  ``trusted_proxies``, set once for every check, or the function's own), ``header`` (an API
  token), ``user`` (the authenticated user), ``path``, ``constant``, ``first`` (fallbacks);
- priority functions (``PriorityFunc``: request -> tier name): ``priorities``;
- ``PathMatcher``: route patterns (exact paths, or globs with ``*``) for per-route rules and
  exemptions.
"""

from __future__ import annotations

import ipaddress
import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from fnmatch import translate
from typing import Any

from ..errors import ConfigError

Network = ipaddress.IPv4Network | ipaddress.IPv6Network


@dataclass(frozen=True, slots=True)
class RequestInfo:
    """One request as checks see it. ``header(name)`` is a case-insensitive lookup.

    ``peer`` is the address of the TCP peer (maybe a proxy; None or a socket path on a Unix
    socket); ``raw`` is the ASGI scope or WSGI environ, for custom key functions;
    ``trusted`` the middleware's trusted proxies, which ``client()`` applies.
    """

    method: str
    path: str
    peer: str | None
    user: str | None
    header: Callable[[str], str | None]
    raw: Any
    trusted: tuple[Network, ...] = ()

    def client(self) -> str:
        """The client's address behind the middleware's trusted proxies (see ``client_ip``)."""
        return resolve_client(self, self.trusted)


KeyFunc = Callable[[RequestInfo], str | None]
PriorityFunc = Callable[[RequestInfo], str]


class _RequestFields:
    """``RequestInfo``'s slots, writable: ``from_scope`` fills one and turns it into a
    ``RequestInfo`` (a frozen dataclass's ``__init__`` costs more than the rest of building
    it; see ``decision._DecisionFields``)."""

    __slots__ = RequestInfo.__slots__
    method: str
    path: str
    peer: str | None
    user: str | None
    header: Callable[[str], str | None]
    raw: Any
    trusted: tuple[Network, ...]


def from_scope(scope: Any, trusted: tuple[Network, ...] = ()) -> RequestInfo:
    """A ``RequestInfo`` for an ASGI HTTP scope."""
    raw_headers = scope.get("headers") or ()

    def header(name: str) -> str | None:
        wanted = name.lower().encode("latin-1")
        found = [v.decode("latin-1") for k, v in raw_headers if k == wanted]
        return ", ".join(found) if found else None

    client = scope.get("client")
    info = _RequestFields()
    info.method = scope.get("method", "GET")
    info.path = scope.get("path", "/")
    info.peer = client[0] if client else None
    user = scope.get("user")
    info.user = None if user is None else _user_name(user)
    info.header = header
    info.raw = scope
    info.trusted = trusted
    info.__class__ = RequestInfo  # type: ignore[assignment]  # same slots: see _RequestFields
    return info  # type: ignore[return-value]  # a RequestInfo now


def from_environ(environ: Any, trusted: tuple[Network, ...] = ()) -> RequestInfo:
    """A ``RequestInfo`` for a WSGI environ."""

    def header(name: str) -> str | None:
        key = name.upper().replace("-", "_")
        if key in ("CONTENT_TYPE", "CONTENT_LENGTH"):
            value = environ.get(key)
        else:
            value = environ.get("HTTP_" + key)
        return None if value is None else str(value)

    return RequestInfo(
        environ.get("REQUEST_METHOD", "GET"),
        environ.get("PATH_INFO", "/") or "/",
        environ.get("REMOTE_ADDR") or None,
        environ.get("REMOTE_USER") or None,
        header,
        environ,
        trusted,
    )


def user_of(scope: Any) -> str | None:
    """The authenticated user's name in an ASGI scope (``scope["user"]``), if any."""
    return _user_name(scope.get("user"))


def _user_name(user: Any) -> str | None:
    if user is None or not getattr(user, "is_authenticated", True):
        return None
    for attr in ("identity", "username", "display_name"):
        value = getattr(user, attr, None)
        if isinstance(value, str) and value:
            return value
    return user if isinstance(user, str) and user else None


def trusted_networks(proxies: Iterable[str]) -> tuple[Network, ...]:
    """Parse trusted proxy addresses or CIDR ranges, naming a bad one."""
    if isinstance(proxies, str):
        proxies = [proxies]
    out = []
    for proxy in proxies:
        try:
            out.append(ipaddress.ip_network(proxy, strict=False))
        except ValueError:
            raise ConfigError(
                f"trusted proxy {proxy!r} is invalid; expected an IP address or CIDR range "
                "such as '10.0.0.0/8'"
            ) from None
    return tuple(out)


Address = ipaddress.IPv4Address | ipaddress.IPv6Address

UNIX_PEER = "unix"
"""The key of a request whose peer has no IP address (a server on a Unix socket) when no
trusted proxy can say who the client is: one counter for everything arriving that way."""


def _parse_ip(text: str) -> Address | None:
    """An IP from ``1.2.3.4``, ``1.2.3.4:5678``, ``[::1]:443`` or ``::1``; an IPv4-mapped IPv6
    address (``::ffff:10.0.0.1``, what a dual-stack socket reports) is its IPv4 address."""
    text = text.strip()
    if text.startswith("[") and "]" in text:  # "[::1]:443"
        text = text[1 : text.index("]")]
    elif text.count(":") == 1:  # "1.2.3.4:5678"
        text = text.split(":", 1)[0]
    try:
        ip = ipaddress.ip_address(text)
    except ValueError:
        return None
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        return ip.ipv4_mapped
    return ip


def resolve_client(request: RequestInfo, networks: tuple[Network, ...]) -> str:
    """The client's address: see ``client_ip``. Never None, so a check keyed by it always
    applies."""
    peer = request.peer
    if not networks:
        if not peer or peer[0] == "/":
            return UNIX_PEER
        if ":" not in peer:  # an IPv4 address: the usual case, as it is
            return peer
        if "." in peer or peer[:2] == "[:" or peer[:7].lower() == "::ffff:":
            ip = _parse_ip(peer)  # a port, brackets or a mapped address: the bare IP
            return peer if ip is None else str(ip)
        return peer
    ip = None if not peer else _parse_ip(peer)
    if ip is not None and not any(ip in n for n in networks):
        return str(ip)
    # a trusted proxy, or a peer without an IP address: a Unix socket, which only a local
    # process can reach, i.e. the proxy in front
    hop = UNIX_PEER if ip is None else str(ip)
    forwarded = request.header("x-forwarded-for")
    if not forwarded:
        return hop
    for entry in reversed(forwarded.split(",")):
        entry_ip = _parse_ip(entry)
        if entry_ip is None:  # garbage before a trusted hop: blame the hop that passed it on
            return hop
        hop = str(entry_ip)
        if not any(entry_ip in n for n in networks):
            return hop
    return hop  # every hop is trusted: the leftmost is the best we know


def client_ip(trusted_proxies: Iterable[str] | None = None) -> KeyFunc:
    """The client's IP: the peer, or — only when the peer is a trusted proxy — the rightmost
    ``X-Forwarded-For`` entry that is not itself a trusted proxy.

    ``trusted_proxies`` None (the default) uses the middleware's ``trusted_proxies``, set once
    for every check; a list here overrides it for this key. A client can put anything in
    ``X-Forwarded-For``; only entries appended by proxies we trust are believed, so a spoofed
    header from an untrusted peer is ignored. An IPv4-mapped IPv6 address (``::ffff:10.0.0.1``)
    is its IPv4 address, for matching and as the key. A peer without an IP address (a Unix
    socket) is a local process: with trusted proxies it is trusted as one, without it the key
    is ``"unix"``. The key is never None: the check always applies.
    """
    if trusted_proxies is None:
        return RequestInfo.client
    networks = trusted_networks(trusted_proxies)
    return lambda request: resolve_client(request, networks)


def header(name: str) -> KeyFunc:
    """The value of a request header (an API token, say); requests without it skip the check."""
    if not isinstance(name, str) or not name:
        raise ConfigError(f"header name {name!r} is invalid; expected e.g. 'X-API-Key'")
    return lambda request: request.header(name) or None


def user() -> KeyFunc:
    """The authenticated user (ASGI ``scope["user"]``, WSGI ``REMOTE_USER``); anonymous skip."""
    return lambda request: request.user


def path() -> KeyFunc:
    """The request path: one counter per route for everyone together."""
    return lambda request: request.path


def constant(value: str) -> KeyFunc:
    """One key for every request (a global limit)."""
    if not isinstance(value, str) or not value:
        raise ConfigError(f"constant key {value!r} is invalid; expected a non-empty string")
    return lambda request: value


def first(*funcs: KeyFunc) -> KeyFunc:
    """The first key any of ``funcs`` gives, e.g. ``first(user(), client_ip())``."""

    def key(request: RequestInfo) -> str | None:
        for func in funcs:
            value = func(request)
            if value is not None:
                return value
        return None

    return key


class PathMatcher:
    """Matches request paths against exact paths and ``*`` globs (``/api/*``)."""

    __slots__ = ("_exact", "_regex", "patterns")

    def __init__(self, patterns: Iterable[str]) -> None:
        if isinstance(patterns, str):
            patterns = [patterns]
        self.patterns = tuple(patterns)
        for p in self.patterns:
            if not isinstance(p, str) or not p.startswith("/"):
                raise ConfigError(f"route pattern {p!r} is invalid; expected a path like '/api/*'")
        self._exact = frozenset(p for p in self.patterns if "*" not in p and "?" not in p)
        globs = [translate(p) for p in self.patterns if p not in self._exact]
        self._regex = re.compile("|".join(f"(?:{g})" for g in globs)) if globs else None

    def __bool__(self) -> bool:
        return bool(self.patterns)

    def __call__(self, path: str) -> bool:
        return path in self._exact or (self._regex is not None and bool(self._regex.match(path)))


READ_METHODS = frozenset({"GET", "HEAD", "OPTIONS"})


def priorities(
    critical: Iterable[str] = (),
    test_mode: Callable[[RequestInfo], bool] | None = None,
    tiers: tuple[str, str, str, str] = ("critical", "post", "get", "test"),
) -> PriorityFunc:
    """Stripe's tiers: test-mode requests lowest, then reads (GET), then writes (POST), and
    ``critical`` routes highest. ``tiers`` renames them (most important first)."""
    critical_paths = PathMatcher(critical)
    top, write, read, test = tiers

    def priority(request: RequestInfo) -> str:
        if test_mode is not None and test_mode(request):
            return test
        if critical_paths and critical_paths(request.path):
            return top
        return read if request.method in READ_METHODS else write

    return priority
