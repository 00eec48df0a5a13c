"""The HTTP API's routes: ``ROUTES``, the one table of routes and who may call them (the
router dispatches from it; tests/abuse/test_auth.py checks every entry and that it matches the
OpenAPI document), and the decision routes the protocol answers itself."""

from __future__ import annotations

from dataclasses import dataclass

from . import quotas as quota_routes
from .nested import CANCEL_FIELDS, RESERVE_FIELDS, SETTLE_FIELDS


@dataclass(frozen=True, slots=True)
class Route:
    """One route: its method, its path (``{name}`` matches the rest of the path) and who may
    call it: ``public`` (no token), ``client`` (either token) or ``admin`` (the admin token)."""

    method: str
    path: str
    access: str


ROUTES: tuple[Route, ...] = (
    Route("POST", "/v1/hit", "client"),
    Route("POST", "/v1/peek", "client"),
    Route("POST", "/v1/refund", "client"),
    Route("POST", "/v1/reset", "admin"),
    Route("POST", "/v1/reserve", "client"),
    Route("POST", "/v1/settle", "client"),
    Route("POST", "/v1/cancel", "client"),
    Route("GET", "/v1/policies", "client"),
    Route("POST", "/v1/concurrency/acquire", "client"),
    Route("POST", "/v1/concurrency/release", "client"),
    Route("POST", "/v1/admin/reload", "admin"),
    Route("POST", "/v1/admin/policies/{name}", "admin"),
    Route("GET", "/healthz", "public"),
    Route("GET", "/healthcheck", "public"),
    Route("GET", "/metrics", "public"),
    Route("GET", "/openapi.json", "public"),
    Route("GET", "/dashboard", "public"),
    Route("GET", "/dashboard/data", "client"),
    Route("POST", "/dashboard/modes", "admin"),
    *(Route(*r) for r in quota_routes.routes()),
)
"""Every route the API serves, the one place that says who may call what (tests read it)."""


_EXACT = {r.path: r for r in ROUTES if "{" not in r.path}


_DECIDE = {"/v1/hit": "hit", "/v1/peek": "peek", "/v1/refund": "refund"}
"""The client routes that decide, served before the router (``ROUTES`` says the same)."""


_FIELDS = {
    "hit": {"policy", "key", "cost", "over_limit_status", "levels"},
    "peek": {"policy", "key", "cost"},
    "refund": {"policy", "key", "cost"},
    "reset": {"policy", "key"},
}
"""The body fields each decision route takes."""


_NESTED = {
    "/v1/reserve": RESERVE_FIELDS,
    "/v1/settle": SETTLE_FIELDS,
    "/v1/cancel": CANCEL_FIELDS,
}
"""The reservation routes and their body fields."""


_TEMPLATED = [(r.path[: r.path.index("{")], r) for r in ROUTES if "{" in r.path]


def find_route(path: str) -> Route | None:
    """The route serving ``path``, or None."""
    route = _EXACT.get(path)
    if route is not None:
        return route
    for head, templated in _TEMPLATED:
        if path.startswith(head) and len(path) > len(head):
            return templated
    return None


def _access_of_unknown(path: str) -> str:
    """Unknown paths under ``/v1/`` still need a token, so they reveal nothing."""
    if path.startswith("/v1/admin/"):
        return "admin"
    return "client" if path.startswith("/v1/") else "public"
