"""The middleware's status route (``status_path=``): a caller's limits, GitHub's ``/rate_limit``.

A ``GET`` of the path the app picks answers, without running the checks and without charging
anything, every rate check as it stands for the caller making the request::

    {"limits": [{"check": "api", "name": "api", "rate": "5000/1h", "limit": 5000, "used": 12,
                 "remaining": 4988, "reset": 1710003600, "plan": "pro", "source": "plan"}]}

A check counting a plan's limit (``"plan:<limit>"``) gives a row per rate of the caller's
limit (``Limiter.status``: plan, source and an override's ``until``); any other check the
deciding rate of a peek of nothing (``plan`` and ``source`` empty). Checks switched off, or
whose key or rate function gives None for this request, are left out. A store that does not
answer gives 503 (``{"error": "unavailable"}``); a key or rate function that raises (or a rate
function that returns no rate) leaves its check out and is logged and counted by the gate as
for any request (``on_error="raise"``: raised).

``targets`` and ``render`` are pure; the runners do the store calls (``Runner.status``).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from ..decision import Decision
from ..errors import ConfigError
from ..quotas.status import QuotaStatus
from .checks import RateCheck
from .gate import Gate, UserFunctionError, call
from .request import RequestInfo

Response = tuple[int, tuple[tuple[str, str], ...], bytes]


@dataclass(frozen=True, slots=True)
class Target:
    """One check to report for a request: its key (with the check's name unless the rate is
    a plan's limit), rate and the plan limit's name (``""`` for a plain rate)."""

    check: RateCheck
    key: str
    rate: Any
    limit: str


def targets(gate: Gate, request: RequestInfo) -> list[Target]:
    """The rate checks to report for ``request`` (module docstring)."""
    out = []
    for check in gate.checks:
        if not isinstance(check, RateCheck) or gate.controls.mode(check.name) == "off":
            continue
        try:
            key = call(check.key, request, "key")
            rate = None if key is None else check.rate
            if callable(rate):
                rate = call(rate, request, "rate")
                try:
                    if rate is not None:
                        gate.check_rate(rate)
                except Exception as exc:
                    raise UserFunctionError(check.rate, "rate", exc) from exc
        except UserFunctionError as err:  # a user's function: logged and counted by the gate
            gate.user_failed(check.name, err, count=False)
            continue
        if key is None or rate is None:
            continue
        limit = rate[5:] if isinstance(rate, str) and rate.startswith("plan:") else ""
        out.append(Target(check, key if limit else f"{check.name}:{key}", rate, limit))
    return out


def decision_row(target: Target, decision: Decision) -> dict[str, Any]:
    """The row of a plain rate's check from a peek of nothing."""
    return {
        "check": target.check.name,
        "name": target.check.name,
        "rate": decision.rate.code,
        "limit": decision.limit,
        "used": decision.used,
        "remaining": decision.remaining,
        "reset": _seconds(decision.reset_at),
        "plan": "",
        "source": "degraded" if decision.degraded else "rate",
    }


def plan_rows(target: Target, rows: Sequence[QuotaStatus]) -> list[dict[str, Any]]:
    """The rows of a plan limit's check: the caller's rows of that limit."""
    out = []
    for row in rows:
        if row.name == target.limit:
            item: dict[str, Any] = {"check": target.check.name, **row.to_dict()}
            item["reset"] = _seconds(item.pop("reset_at"))
            out.append(item)
    return out


def render(rows: list[dict[str, Any]]) -> Response:
    """The 200 answer."""
    return _json(200, {"limits": rows})


def not_allowed() -> Response:
    """The 405 answer to a method other than GET or HEAD."""
    status, headers, body = _json(405, {"error": "method_not_allowed"})
    return status, (*headers, ("Allow", "GET, HEAD")), body


def check_status_path(path: object) -> str | None:
    """None (no status route) or a path starting with ``/``."""
    if path is not None and (not isinstance(path, str) or not path.startswith("/")):
        raise ConfigError(f"status_path={path!r} is invalid; expected a path like '/rate_limit'")
    return path


def unavailable() -> Response:
    """The 503 answer when the store does not answer."""
    return _json(503, {"error": "unavailable", "message": "the rate limit store does not answer"})


def _json(status: int, body: dict[str, Any]) -> Response:
    data = json.dumps(body, separators=(",", ":")).encode()
    headers = (
        ("Content-Type", "application/json"),
        ("Content-Length", str(len(data))),
        ("Cache-Control", "no-store"),
    )
    return status, headers, data


def _seconds(epoch: float) -> int:
    return int(-(-epoch // 1))
