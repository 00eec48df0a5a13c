"""What the service checks in a request's head before it reads the body: the headers those
checks need (``Head``) and the browser rules (``BrowserRules``).

A page open in a browser can send requests to the service: a form post or
``fetch(url, {mode: "no-cors"})`` with a ``text/plain`` body needs no CORS preflight, and a
DNS name rebound to ``127.0.0.1`` makes the service same-origin to the page. Without tokens
(local use) such a page could flip a kill switch or read ``/dashboard/data``. So:

- **Host**: the ``Host`` header must name the address the service listens on (loopback: any
  of ``localhost``, ``127.0.0.1``, ``[::1]``), or one of ``--allowed-host``; on a wildcard
  address (``0.0.0.0``, ``::``) any name is served unless names are configured. The port is
  not compared. A request with two ``Host`` headers is refused.
- **State-changing requests** (every method but GET, HEAD and OPTIONS) must not come from
  another site: ``Sec-Fetch-Site: cross-site`` is refused, and so is an ``Origin`` whose
  host and port differ from the request's ``Host`` (``Origin: null`` too) unless it is one
  of ``--allowed-origin``. They must carry a JSON body (``Content-Type: application/json``)
  or an ``Authorization`` header: a browser sends neither across sites without a
  preflight, which the service never grants.

Refusals are ``BadRequest``: 400 ``host``, 403 ``origin``, 415 ``content-type``; the
token (when one is configured) is checked between the origin and the content type, so a
request without one is told so (401).
"""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass, field

from ...errors import BadRequest

NOTED = {
    b"host": "host",
    b"origin": "origin",
    b"sec-fetch-site": "fetch_site",
    b"content-type": "content_type",
    b"authorization": "authorization",
    b"content-length": "content_length",
    b"transfer-encoding": "transfer_encoding",
    b"expect": "expect",
}
"""The headers ``Head`` keeps (names lower case), and the slot each goes to."""
LOOPBACK_NAMES = frozenset({"localhost", "127.0.0.1", "[::1]"})
_SAFE_METHODS = frozenset({"GET", "HEAD", "OPTIONS"})
_SEEN = 256
_JSON = b"application/json"


class Head:
    """The headers of a request that the checks read (the first of each; ``repeated``
    names the ones sent more than once)."""

    __slots__ = (
        "authorization", "content_length", "content_type", "expect", "fetch_site", "host",
        "origin", "repeated", "transfer_encoding",
    )  # fmt: skip

    def __init__(self) -> None:
        self.host: bytes | None = None
        self.origin: bytes | None = None
        self.fetch_site: bytes | None = None
        self.content_type: bytes | None = None
        self.authorization: bytes | None = None
        self.content_length: bytes | None = None
        self.transfer_encoding: bytes | None = None
        self.expect: bytes | None = None
        self.repeated: list[str] | None = None

    def note(self, name: bytes, value: bytes) -> None:
        """Keep ``value`` if ``name`` (lower case) is one of the headers checked."""
        slot = NOTED.get(name)
        if slot is not None:
            self.put(slot, value)

    def put(self, slot: str, value: bytes) -> None:
        """Keep ``value`` in ``slot`` (a value of ``NOTED``) unless it is set already."""
        if getattr(self, slot) is None:
            setattr(self, slot, value)
        elif self.repeated is None:
            self.repeated = [slot]
        else:
            self.repeated.append(slot)

    @classmethod
    def of(cls, headers: list[tuple[bytes, bytes]]) -> Head:
        """The head of an ASGI scope's ``headers`` (names lower case)."""
        head = cls()
        for name, value in headers:
            slot = NOTED.get(name)
            if slot is not None:
                head.put(slot, value)
        return head


@dataclass(frozen=True, slots=True)
class BrowserRules:
    """The rules of the module docstring. ``hosts``: the host names served (lower case, no
    port, IPv6 in brackets), None for any; ``origins``: other origins allowed to send
    state-changing requests (``scheme://host[:port]``, lower case)."""

    hosts: frozenset[str] | None = LOOPBACK_NAMES
    origins: frozenset[str] = frozenset()
    _seen: dict[bytes, bool] = field(default_factory=dict, compare=False, repr=False)
    """``Host`` values met, and whether each is served (at most ``_SEEN`` of them)."""

    @classmethod
    def for_listen(
        cls,
        address: str,
        hosts: tuple[str, ...] = (),
        origins: tuple[str, ...] = (),
    ) -> BrowserRules:
        """The rules for a service listening on ``address`` (``--host``), with the names and
        origins an operator allowed besides (``*`` among the names: any)."""
        extra = {_host_name(h) for h in hosts}
        allowed = frozenset(o.strip().rstrip("/").lower() for o in origins)
        if "*" in extra:
            return cls(None, allowed)
        if is_wildcard(address):
            return cls(frozenset(extra) if extra else None, allowed)
        own = {_host_name(address)}
        if is_loopback(address):
            own |= LOOPBACK_NAMES
        return cls(frozenset(own | extra), allowed)

    def check(self, method: str, head: Head) -> None:
        """Raise ``BadRequest`` if the request breaks a rule (module docstring)."""
        host = head.host
        if head.repeated is not None and "host" in head.repeated:
            raise BadRequest("host", "the request has more than one Host header")
        if host is not None and self.hosts is not None:
            served = self._seen.get(host)
            if served is None:
                served = self._learn(host)
            if not served:
                name = _host_name(host.decode("latin-1"))
                shown = name if len(name) <= 80 else name[:80] + "..."
                raise BadRequest(
                    "host",
                    f"host {shown!r} is not served here; expected {', '.join(sorted(self.hosts))} "
                    "(ratekeeper serve --allowed-host adds names)",
                )
        if method in _SAFE_METHODS:
            return
        if head.fetch_site == b"cross-site":
            raise BadRequest("origin", "a request from another site may not change state", 403)
        origin = head.origin
        if origin is not None and not self._same_origin(origin, host):
            shown = origin.decode("latin-1")[:80]
            raise BadRequest(
                "origin",
                f"origin {shown!r} may not change state here (ratekeeper serve --allowed-origin "
                "adds origins)",
                403,
            )

    def check_content(self, method: str, head: Head) -> None:
        """Raise ``BadRequest`` (415) if a state-changing request has neither a JSON body nor
        an ``Authorization`` header (after ``check``, and after the token is checked)."""
        if method in _SAFE_METHODS:
            return
        kind = head.content_type
        if (
            kind != _JSON
            and head.authorization is None
            and (kind is None or kind.partition(b";")[0].strip().lower() != _JSON)
        ):
            raise BadRequest(
                "content-type",
                "a request that changes state needs Content-Type: application/json or an "
                "Authorization header",
                415,
            )

    def _learn(self, host: bytes) -> bool:
        """Whether ``host`` is served, remembered (the memory is bounded: forgotten whole
        when full, since a client may send any value)."""
        assert self.hosts is not None
        served = _host_name(host.decode("latin-1")) in self.hosts
        if len(self._seen) >= _SEEN:
            self._seen.clear()
        self._seen[host] = served
        return served

    def _same_origin(self, origin: bytes, host: bytes | None) -> bool:
        """Whether ``origin`` is the request's own host (any scheme) or an allowed one."""
        text = origin.decode("latin-1").strip().lower()
        if text in self.origins:
            return True
        scheme, sep, authority = text.partition("://")
        if not sep or host is None or scheme not in ("http", "https"):
            return False
        return authority == host.decode("latin-1").strip().lower()


def _host_name(host: str) -> str:
    """A ``Host`` value or listen address as compared: lower case, without port or final
    dot, an IPv6 address in brackets."""
    host = host.strip().lower()
    if host.startswith("["):
        end = host.find("]")
        return host[: end + 1] if end > 0 else host
    if host.count(":") > 1:  # a bare IPv6 address (a listen address)
        return f"[{host}]"
    return host.partition(":")[0].rstrip(".")


def is_wildcard(address: str) -> bool:
    """Whether ``address`` (``--host``) is every interface: ``0.0.0.0``, ``::`` or empty."""
    return address.strip("[]") in ("", "0.0.0.0", "::")


def is_loopback(address: str) -> bool:
    """Whether ``address`` (``--host``) is reachable from this machine only."""
    bare = address.strip("[]").lower()
    if bare == "localhost":
        return True
    try:
        return ipaddress.ip_address(bare).is_loopback
    except ValueError:
        return False
