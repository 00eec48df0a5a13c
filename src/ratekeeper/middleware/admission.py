"""``Admission``: what one request was granted, and the headers a middleware adds from it.

The gate fills an admission as it walks the checks; the middleware leaves it in the ASGI scope
or WSGI environ (``SCOPE_KEY``) for a framework's route limits to walk into, and reads its
headers (``added_headers``, ``added_header_lines``) when the response starts.
"""

from __future__ import annotations

from ..decision import Decision, ascii_name
from ..overload.admission import Ticket
from ..overload.concurrency import Lease
from .costs import Usage
from .ops import Op
from .request import RequestInfo
from .responses import Headers, Rejection, concurrency_headers, decision_headers

SCOPE_KEY = "ratekeeper.overload.admission"
"""Where the middleware leaves a request's ``Admission`` (ASGI scope, WSGI environ), for a
framework integration to walk a route's checks into after routing."""


class Admission:
    """What one request was granted: charges, leases, headers, or the rejection."""

    __slots__ = (
        "aborted",
        "best",
        "busy",
        "charged",
        "done",
        "entered",
        "key",
        "leases",
        "rejection",
        "request",
        "settled",
        "tickets",
        "tier",
        "usage",
        "walked",
    )

    def __init__(self, request: RequestInfo | None = None, usage: Usage | None = None) -> None:
        self.request = request
        self.usage = usage
        """What the request used (bytes, reported cost): what a settling check charges."""
        self.tier: str | None = None
        self.best: tuple[str, Decision, str | None, str] | None = None
        """(the check's name, the decision, its quota unit, its item name in headers)."""
        self.busy: list[tuple[str, int, int]] | None = None
        """Concurrency checks passed: (name, capacity, requests in progress)."""
        self.settled = False
        self.charged: list[Op] = []
        self.leases: list[tuple[int, Lease]] = []
        self.tickets: list[tuple[int, Ticket]] = []
        self.rejection: Rejection | None = None
        self.entered = False
        self.done = False
        self.aborted = False
        self.key: str | None = None
        """The caller key of the check being walked (for the top-keys sketch)."""
        self.walked: set[int] | None = None
        """Positions walked by name (``admit(..., positions)``): each is walked once."""


_BODY_HEADERS = frozenset({"Content-Type", "Content-Length"})


def added_headers(adm: Admission) -> Headers:
    """The headers a middleware adds to the app's response: those of the enforced rate decision
    with least remaining; or, when a route's limit rejected the request and the app answered it
    (a framework's error handler shapes the 429), the rejection's rate-limit headers, so every
    429 carries them whoever wrote it."""
    rejection = adm.rejection
    if rejection is None:
        best = adm.best
        headers = () if best is None else decision_headers(*best)
        return concurrency_headers(headers, adm.busy) if adm.busy else headers
    return tuple(h for h in rejection.headers if h[0] not in _BODY_HEADERS)


_RESOURCE = b"x-ratelimit-resource"
_RESOURCES: dict[str, bytes] = {}


def added_header_lines(adm: Admission) -> list[tuple[bytes, bytes]]:
    """``added_headers`` as an ASGI server sends them (lower-case names, bytes), built from the
    decision without ``str`` headers in between."""
    best = adm.best
    if adm.rejection is not None or best is None or adm.busy:
        return [(n.lower().encode(), v.encode("latin-1")) for n, v in added_headers(adm)]
    name, decision, unit, item = best
    resource = _RESOURCES.get(name)
    if resource is None:
        if len(_RESOURCES) >= 4096:
            _RESOURCES.clear()
        resource = _RESOURCES[name] = ascii_name(name).encode()
    lines = decision.header_lines(item, unit)
    lines.append((_RESOURCE, resource))
    return lines
