"""The dashboard in the service: ``GET /dashboard`` (the page), ``GET /dashboard/data`` (its
JSON; client token) and ``POST /dashboard/modes`` (a toggle; admin token), routed by
``http.routes.ROUTES`` like every other route. The page and the data are ``ratekeeper.dashboard``'s;
here the engine's policies are its toggles: ``off`` is ``enabled: false`` (the kill switch),
``shadow`` is ``shadow: true``, until the next reload, as ``POST /v1/admin/policies/{name}``.
The data also lists Envoy's quota buckets (``rlqs``: ``rlqs_stats.Row`` each).
"""

from __future__ import annotations

from dataclasses import asdict
from typing import Any

from ...dashboard import PAGE, snapshot
from ...errors import BadRequest
from ...middleware.checks import MODES
from ..engine import Engine

__all__ = ["PAGE", "EngineModes", "data", "set_mode"]


class EngineModes:
    """The engine's rate and concurrency policies as the dashboard's ``Modes``."""

    def __init__(self, engine: Engine) -> None:
        self.engine = engine

    def modes(self) -> dict[str, str]:
        engine = self.engine
        config = engine.config
        out = {}
        for name in config.policies:
            spec = engine.spec(name)
            out[name] = _mode(spec.enabled, spec.shadow)
        for name in config.concurrency:
            lease = engine.concurrency_spec(name)
            out[name] = _mode(lease.enabled, lease.shadow)
        return out

    def set_mode(self, name: str, mode: str) -> None:
        config = self.engine.config
        if name not in config.policies and name not in config.concurrency:
            raise KeyError(name)
        self.engine.toggle(name, enabled=mode != "off", shadow=mode == "shadow")


def _mode(enabled: bool, shadow: bool) -> str:
    return "off" if not enabled else "shadow" if shadow else "enforce"


def data(engine: Engine) -> dict[str, Any]:
    """What ``/dashboard/data`` answers, with the Envoy quota buckets (``rlqs``)."""
    out = snapshot(engine.metrics, EngineModes(engine))
    out["rlqs"] = [asdict(row) for row in engine.metrics.rlqs.rows()]
    config = engine.config
    for row in out["policies"]:  # the configured limit, for the incident view
        name = row["name"]
        if name in config.policies:
            spec = config.policies[name]
            row["limit"] = f"{spec.rate_text} ({spec.algorithm})"
        elif name in config.concurrency:
            row["limit"] = f"{config.concurrency[name].capacity} at once"
    return out


def set_mode(engine: Engine, req: dict[str, Any]) -> dict[str, Any]:
    """Apply ``{"name", "mode"}`` (validated whole before anything changes)."""
    name, mode = req.get("name"), req.get("mode")
    if mode not in MODES:
        raise BadRequest("mode", f"mode {mode!r} is invalid; expected enforce, shadow or off")
    if not isinstance(name, str) or not name:
        raise BadRequest("name", f"name {name!r} is invalid; expected a policy name")
    modes = EngineModes(engine)
    try:
        modes.set_mode(name, mode)
    except KeyError:
        raise BadRequest("name", f"policy {name[:100]!r} is not configured", 404) from None
    return {"name": name, "mode": modes.modes()[name]}
