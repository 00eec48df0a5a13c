"""The live dashboard: a page and its JSON, served by the service at ``/dashboard`` or mounted
into any ASGI app.

    from ratekeeper.dashboard import Dashboard, ControlsModes
    metrics = Metrics(top_keys=64)
    app.add_middleware(RateLimitMiddleware, checks=checks, controls=controls, metrics=metrics)
    app.mount("/dashboard", Dashboard(metrics, ControlsModes(controls, checks), admin_token=...))

The page (``page.html``: inline CSS, SVG and JS, no external asset, works offline) polls
``<its path>/data`` every second: decisions and rejections per second per policy (from the
counters' deltas), the top limited keys (the metrics' Space-Saving sketch), breaker states,
shedder drop probabilities per tier and requests in flight. Its toggles post
``{"name", "mode"}`` (``enforce``, ``shadow``, ``off``) to ``<its path>/modes`` with the admin
bearer token; without an admin token configured, toggles are refused. ``token`` (optional)
guards the data. Tokens are compared in constant time.
"""

from __future__ import annotations

import hmac
import json
import time
from collections.abc import Awaitable, Callable, Iterable, MutableMapping
from importlib import resources
from typing import Any, Protocol

from ..errors import ConfigError
from ..metrics.core import Metrics
from ..middleware.checks import MODES, Controls

Scope = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[MutableMapping[str, Any]]]
Send = Callable[[MutableMapping[str, Any]], Awaitable[None]]
MAX_BODY = 4096
PAGE = resources.files(__package__).joinpath("page.html").read_bytes()
"""The dashboard page, read once."""


class Modes(Protocol):
    """What the toggles switch: a mode per name."""

    def modes(self) -> dict[str, str]:
        """Each policy or check name and its mode now: ``enforce``, ``shadow`` or ``off``."""
        ...

    def set_mode(self, name: str, mode: str) -> None:
        """Switch ``name`` (raise ``KeyError`` if there is no such name)."""
        ...


class ControlsModes:
    """The middleware's ``Controls`` over its checks, as ``Modes``."""

    def __init__(self, controls: Controls, checks: Iterable[Any]) -> None:
        self.controls = controls
        self.names = [c.name for c in checks]

    def modes(self) -> dict[str, str]:
        return {n: self.controls.mode(n) for n in self.names}

    def set_mode(self, name: str, mode: str) -> None:
        if name not in self.names:
            raise KeyError(name)
        self.controls.set(name, mode)


def snapshot(metrics: Metrics, modes: Modes | None, top: int = 20) -> dict[str, Any]:
    """The data the page shows, as JSON-ready values."""
    policies: dict[str, dict[str, float]] = {}
    for (policy, outcome), value in metrics.decisions.samples():
        policies.setdefault(policy, {})[outcome] = value
    current = modes.modes() if modes is not None else {}
    for name in current:
        policies.setdefault(name, {})
    heavy = metrics.top.top(top) if metrics.top is not None else []
    return {
        "now": time.time(),
        "policies": [
            {"name": n, "mode": current.get(n), "decisions": policies[n]} for n in sorted(policies)
        ],
        "top_keys": [
            {
                "policy": h.group,
                "key": h.item,
                "count": h.count,
                "error": h.error,
                "first_seen": h.first_seen,
                "last_seen": h.last_seen,
            }
            for h in heavy
        ],
        "top_keys_kept": metrics.top is not None,
        "breakers": [
            {"store": s, "shard": sh, "kind": k, "state": int(v)}
            for (s, sh, k), v in metrics.breaker_state.samples()
        ],
        "shedders": [
            {"shedder": s, "tier": t, "drop_probability": p}
            for (s, t), p in metrics.shed_drop.samples()
        ],
        "in_flight": sum(v for _, v in metrics.in_flight.samples()),
    }


def change_mode(modes: Modes | None, body: bytes) -> tuple[int, dict[str, Any]]:
    """Apply a toggle request ``{"name", "mode"}``: (status, JSON answer)."""
    if modes is None:
        return 404, {"error": "no toggles here", "field": "name"}
    try:
        req = json.loads(body)
    except ValueError:
        return 400, {"error": "the body is not valid JSON", "field": "body"}
    if not isinstance(req, dict) or set(req) != {"name", "mode"}:
        return 400, {"error": "expected a JSON object with name and mode", "field": "body"}
    name, mode = req["name"], req["mode"]
    if mode not in MODES:
        return 400, {"error": f"mode {mode!r} is invalid; expected enforce, shadow or off",
                     "field": "mode"}  # fmt: skip
    if not isinstance(name, str):
        return 400, {"error": "name must be a string", "field": "name"}
    try:
        modes.set_mode(name, mode)
    except KeyError:
        return 404, {"error": f"no policy {name[:100]!r}", "field": "name"}
    return 200, {"name": name, "mode": modes.modes().get(name, mode)}


def bearer(scope: Scope) -> bytes:
    """The bearer token of a request, or b""."""
    for k, v in scope.get("headers", ()):
        if k == b"authorization":
            scheme, _, token = v.partition(b" ")
            return token.strip() if scheme.lower() == b"bearer" else b""
    return b""


def same(given: bytes, expected: str) -> bool:
    """Constant-time token comparison; an empty expected token matches nothing."""
    return bool(expected) and hmac.compare_digest(given, expected.encode())


class Dashboard:
    """The dashboard as an ASGI app (mount it, or wrap ``app`` and serve it under ``path``)."""

    def __init__(
        self,
        metrics: Metrics,
        modes: Modes | None = None,
        *,
        token: str = "",
        admin_token: str = "",
        app: Callable[[Scope, Receive, Send], Awaitable[None]] | None = None,
        path: str = "/dashboard",
    ) -> None:
        if not isinstance(metrics, Metrics):
            raise ConfigError(
                f"metrics={metrics!r} is invalid; expected ratekeeper.metrics.Metrics"
            )
        self.metrics = metrics
        self.modes = modes
        self.token = token
        self.admin_token = admin_token
        self.app = app
        self.path = path.rstrip("/")

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        path: str = scope.get("path", "/")
        root = scope.get("root_path", "")
        if root and path.startswith(root):
            path = path[len(root) :] or "/"
        if self.app is not None:
            if scope["type"] != "http" or not (path + "/").startswith(self.path + "/"):
                await self.app(scope, receive, send)
                return
            path = path[len(self.path) :] or "/"
        if scope["type"] != "http":
            return
        status, body, kind = await self._answer(scope, receive, path.rstrip("/") or "/")
        headers = [(b"content-type", kind), (b"content-length", b"%d" % len(body)),
                   (b"cache-control", b"no-store")]  # fmt: skip
        await send({"type": "http.response.start", "status": status, "headers": headers})
        await send({"type": "http.response.body", "body": body})

    async def _answer(self, scope: Scope, receive: Receive, path: str) -> tuple[int, bytes, bytes]:
        method = scope.get("method", "GET")
        if path == "/" and method == "GET":
            return 200, PAGE, b"text/html; charset=utf-8"
        if path == "/data" and method == "GET":
            if self.token and not (
                same(bearer(scope), self.token) or same(bearer(scope), self.admin_token)
            ):
                return _json(
                    401, {"error": "missing or wrong bearer token", "field": "authorization"}
                )
            return _json(200, snapshot(self.metrics, self.modes))
        if path == "/modes" and method == "POST":
            if not self.admin_token:
                return _json(403, {"error": "toggles are off: no admin token set",
                                   "field": "authorization"})  # fmt: skip
            if not same(bearer(scope), self.admin_token):
                return _json(401 if not bearer(scope) else 403,
                             {"error": "this needs the admin bearer token",
                              "field": "authorization"})  # fmt: skip
            body = await read_body(receive)
            if body is None:
                return _json(413, {"error": f"body over {MAX_BODY} bytes", "field": "body"})
            return _json(*change_mode(self.modes, body))
        return _json(404, {"error": f"no route {path[:100]!r}", "field": "path"})


async def read_body(receive: Receive) -> bytes | None:
    """The request body, or None past ``MAX_BODY``."""
    chunks: list[bytes] = []
    size = 0
    while True:
        message = await receive()
        if message["type"] != "http.request":
            return b"".join(chunks)
        chunk = message.get("body", b"")
        size += len(chunk)
        if size > MAX_BODY:
            return None
        chunks.append(chunk)
        if not message.get("more_body", False):
            return b"".join(chunks)


def _json(status: int, value: Any) -> tuple[int, bytes, bytes]:
    return status, json.dumps(value, separators=(",", ":")).encode(), b"application/json"
