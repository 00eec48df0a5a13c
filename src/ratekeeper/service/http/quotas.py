"""The HTTP routes of plans: a caller's status, and support's admin operations, audited.

::

    GET  /v1/status?key=K                       every limit of K, charging nothing   client
    POST /v1/admin/quotas/reset                 {"key", "limit", "by"?, "reason"?}   admin
    POST /v1/admin/quotas/credit  .../debit     {"key", "limit", "units", ...}      admin
    POST /v1/admin/quotas/override              {"tenant", "limit", "rate", "until"?, ...}
    POST /v1/admin/quotas/clear-override        {"tenant", "limit", ...}
    POST /v1/admin/quotas/plan                  {"tenant", "plan" (null: the default), ...}
    GET  /v1/admin/quotas/audit?count=N         the latest audit entries, newest first

``limit`` (reset, credit, debit) is a policy's name or a plan's limit (``api`` or ``plan:api``;
a policy of that name wins over a limit): a policy of ``rate: plan:<limit>`` acts on the
caller's tenant's limit, any other on the policy's counters of the key. ``/v1/status`` lists
the plans' limits of the key's tenant (when plans are configured) and every rate policy's
state for the key (``/v1/hit``'s counters), each with where it comes from.

Each change is written to the audit log (``engine.quotas``) with who made it: the token that
authorised the call (``admin token``, or ``no token`` on a service without tokens) and the
client's address, and the ``by`` the caller names (the person at the support desk).
Overrides and plan changes need ``quotas.source: redis`` (a plans file is changed by editing
it and reloading). Every mistake is a 4xx naming the value; a store that fails is a 503.
"""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING, Any
from urllib.parse import parse_qsl

from ...errors import BadRequest, ConfigError, RateSpecError, StoreUnavailable
from ...quotas import Adjustment, AsyncAdmin, Override
from ...quotas.calls import MAX_UNITS
from ...quotas.catalog import parse_until
from ..engine import store_key

if TYPE_CHECKING:
    from ..engine import Engine

ADMIN = "/v1/admin/quotas/"
ACTIONS = ("reset", "credit", "debit", "override", "clear-override", "plan")
FIELDS = {
    "reset": {"key", "limit", "by", "reason"},
    "credit": {"key", "limit", "units", "by", "reason"},
    "debit": {"key", "limit", "units", "by", "reason"},
    "override": {"tenant", "limit", "rate", "until", "by", "reason"},
    "clear-override": {"tenant", "limit", "by", "reason"},
    "plan": {"tenant", "plan", "by", "reason"},
}
"""The body fields each admin action takes."""
MAX_COUNT = 1000


def routes() -> list[tuple[str, str, str]]:
    """(method, path, access) of every route here (``routes.ROUTES`` takes them)."""
    found = [("GET", "/v1/status", "client"), ("GET", ADMIN + "audit", "admin")]
    found += [("POST", ADMIN + action, "admin") for action in ACTIONS]
    return found


async def answer(
    engine: Engine, path: str, scope: dict[str, Any] | Any, req: dict[str, Any] | None
) -> tuple[int, Any]:
    """The answer to one of ``routes()`` (its token checked already); ``req``: the JSON body of
    a POST (unknown fields refused by the caller with ``FIELDS``)."""
    try:
        if path == "/v1/status":
            return 200, await status(engine, _query(scope, {"key"}).get("key"))
        plans = engine.plans
        if plans.admin is None and path != ADMIN + "audit":
            raise BadRequest("limit", "no plans are configured (add a quotas: section)", 404)
        if path == ADMIN + "audit":
            count = _count(_query(scope, {"count"}).get("count", "100"))
            return 200, {"entries": [e.to_dict() for e in plans.entries(count)]}
        assert req is not None and plans.admin is not None
        return 200, await change(engine, plans.admin, path[len(ADMIN) :], req, _who(engine, scope))
    except (ConfigError, RateSpecError) as exc:
        raise BadRequest(_field_of(str(exc)), str(exc)) from None
    except StoreUnavailable as exc:
        raise BadRequest("store", f"the store failed; nothing was changed: {exc}", 503) from None


async def status(engine: Engine, key: object) -> dict[str, Any]:
    """Every limit of ``key``: the plans' (its tenant's) and each rate policy's, charging
    nothing."""
    if key is None:
        raise BadRequest("key", "key is missing; expected ?key=<caller key>")
    key = engine.check_key(key)
    limiter = engine.limiter
    out: dict[str, Any] = {"key": key}
    rows: list[dict[str, Any]] = []
    quotas = engine.plans.quotas
    if quotas is not None:
        tenant = quotas.tenant(key)
        found = await limiter.status(key)
        resolved = quotas.cached(key, int(limiter.clock() * 1000))
        out.update(tenant=tenant, plan=None if resolved is None else resolved.plan)
        rows += [{"kind": "plan", **row.to_dict()} for row in found]
    specs = [s for s in engine.config.policies.values() if not s.plan and not s.aligned]
    core = limiter._core
    plans = [core.plan_of("peek", store_key(s.name, key), s.policy, 0) for s in specs]
    try:
        outcomes = await asyncio.gather(*(limiter.store.execute_async(p) for p in plans))
    except Exception as exc:
        raise StoreUnavailable(f"status of {key[:100]!r}: {exc}") from exc
    for spec, found_outcomes in zip(specs, outcomes, strict=True):
        for rate, lim, o in zip(spec.policy.rates, spec.policy.limits, found_outcomes, strict=True):
            rows.append(
                {
                    "kind": "policy",
                    "name": spec.name,
                    "rate": rate.code,
                    "limit": lim.capacity,
                    "used": lim.capacity - o.remaining,
                    "remaining": o.remaining,
                    "reset_at": o.reset_ms / 1000,
                    "plan": "",
                    "source": "policy",
                    "algorithm": spec.algorithm,
                    "until": None,
                    "enabled": spec.enabled,
                }
            )
    out["limits"] = rows
    return out


async def change(
    engine: Engine, admin: AsyncAdmin, action: str, req: dict[str, Any], who: str
) -> dict[str, Any]:
    """One admin action, applied and audited."""
    by = _by(req, who)
    reason = _text(req, "reason", 500)
    if action in ("reset", "credit", "debit"):
        key = engine.check_key(req.get("key"))
        units = 0 if action == "reset" else _units(req.get("units"))
        done = await _adjust(engine, admin, action, key, _limit(req), units, by, reason)
        return {
            "action": done.action,
            "key": done.key,
            "limit": done.limit,
            "units": done.units,
            "before": [r.to_dict() for r in done.before],
            "after": [r.to_dict() for r in done.after],
            "audit": done.entry.to_dict(),
        }
    tenant = _tenant(req)
    plan = req.get("plan")
    if action == "plan" and ("plan" not in req or not (plan is None or isinstance(plan, str))):
        raise BadRequest("plan", f"plan {plan!r} is invalid; expected a plan name or null")
    if not engine.plans.writable:
        raise BadRequest(
            "tenant",
            "quotas.source is file: overrides and plan changes live in the plans file; "
            "edit it and reload, or use quotas.source: redis",
            409,
        )
    if action == "plan":
        await admin.set_plan(tenant, plan, by=by, reason=reason)
        engine.cache.clear()
        return {"action": "plan", "tenant": tenant, "plan": plan, "audit": _last(engine)}
    limit = _limit(req)
    if limit.startswith("plan:"):
        limit = limit[5:]
    if action == "clear-override":
        await admin.clear_override(tenant, limit, by=by, reason=reason)
        return {"action": action, "tenant": tenant, "limit": limit, "audit": _last(engine)}
    rate = req.get("rate")
    if not isinstance(rate, str) or not rate:
        raise BadRequest("rate", f"rate {rate!r} is invalid; expected a rate like '20000/hour'")
    try:
        until = parse_until(req.get("until"))
    except ConfigError as exc:
        raise BadRequest("until", str(exc)) from None
    override: Override = await admin.override(
        tenant, limit, rate, until=until, by=by, reason=reason
    )
    return {
        "action": action,
        "tenant": tenant,
        "limit": limit,
        "override": override.to_dict(),
        "audit": _last(engine),
    }


async def _adjust(
    engine: Engine,
    admin: AsyncAdmin,
    op: str,
    key: str,
    limit: str,
    units: int,
    by: str,
    reason: str,
) -> Adjustment:
    """A reset, credit or debit of a policy's counters or a plan's limit."""
    spec = None if limit.startswith("plan:") else engine.config.policies.get(limit)
    if spec is not None and spec.plan:
        limit, spec = spec.plan, None
    if spec is None:
        quotas = engine.plans.quotas
        name = limit[5:] if limit.startswith("plan:") else limit
        if quotas is None or name not in quotas.plans.limit_names:
            known = sorted(n for n, s in engine.config.policies.items() if not s.aligned)
            if quotas is not None:
                known += [f"plan:{n}" for n in quotas.plans.limit_names]
            raise BadRequest(
                "limit",
                f"limit {limit!r} is neither a policy nor a plan's limit; "
                f"expected one of {', '.join(known) or 'none'}",
                404,
            )
        method = getattr(admin, op)
        args = (key, name) if op == "reset" else (key, name, units)
        done: Adjustment = await method(*args, by=by, reason=reason)
        return done
    engine.cache.forget(spec.name, key)
    limiter = admin.limiter
    applied = await limiter.administer(op, store_key(spec.name, key), spec.policy, units)
    engine.cache.forget(spec.name, key)
    return admin.adjusted(op, key, spec.name, units, by, reason, applied, "", None)


def _who(engine: Engine, scope: Any) -> str:
    """The token that authorised the call and the client's address (``who``: the CLI's
    user on the store itself)."""
    if isinstance(scope, dict) and isinstance(scope.get("who"), str):
        return str(scope["who"])
    auth = engine.config.auth
    token = "admin token" if auth.admin_token else ("token" if auth.token else "no token")
    client = scope.get("client") if isinstance(scope, dict) else None
    host = client[0] if isinstance(client, list | tuple) and client else "unknown client"
    return f"{token} from {host}"


def _by(req: dict[str, Any], who: str) -> str:
    named = _text(req, "by", 200)
    return f"{named} ({who})" if named else who


def _text(req: dict[str, Any], field: str, most: int) -> str:
    value = req.get(field, "")
    if not isinstance(value, str) or len(value) > most:
        raise BadRequest(
            field,
            f"{field} {str(value)[:50]!r} is invalid; expected text of at most {most} characters",
        )
    return value


def _limit(req: dict[str, Any]) -> str:
    limit = req.get("limit")
    if not isinstance(limit, str) or not limit or len(limit) > 200:
        raise BadRequest(
            "limit",
            f"limit {str(limit)[:50]!r} is invalid; expected a policy "
            "name or a plan's limit (plan:<name>)",
        )
    return limit


def _tenant(req: dict[str, Any]) -> str:
    tenant = req.get("tenant")
    if not isinstance(tenant, str) or not tenant or len(tenant) > 1000:
        raise BadRequest(
            "tenant", f"tenant {str(tenant)[:50]!r} is invalid; expected 1-1000 characters"
        )
    return tenant


def _units(units: object) -> int:
    if isinstance(units, float) and units.is_integer():
        units = int(units)
    if isinstance(units, bool) or not isinstance(units, int) or not 1 <= units <= MAX_UNITS:
        raise BadRequest(
            "units",
            f"units {repr(units)[:30]} is invalid; expected a whole number from 1 to "
            f"{MAX_UNITS} (credit gives, debit takes)",
        )
    return units


def _count(text: str) -> int:
    if not text.isdigit() or not 1 <= int(text) <= MAX_COUNT:
        raise BadRequest("count", f"count {text[:30]!r} is invalid; expected 1 to {MAX_COUNT}")
    return int(text)


def _query(scope: Any, allowed: set[str]) -> dict[str, str]:
    """The query string's parameters, each once, none unknown."""
    raw = scope.get("query_string", b"") if isinstance(scope, dict) else b""
    try:
        pairs = parse_qsl(raw.decode("utf-8"), keep_blank_values=True, max_num_fields=10)
    except (UnicodeDecodeError, ValueError) as exc:
        raise BadRequest("query", f"the query string is invalid: {exc}") from None
    out: dict[str, str] = {}
    for name, value in pairs:
        if name not in allowed:
            raise BadRequest(
                "query",
                f"query parameter {name[:50]!r} is unknown; expected {', '.join(sorted(allowed))}",
            )
        if name in out:
            raise BadRequest(name, f"query parameter {name!r} is given twice")
        out[name] = value
    return out


def _last(engine: Engine) -> dict[str, Any] | None:
    """The audit entry the action just wrote (this process keeps the latest ones)."""
    entries = engine.plans.recent.entries
    return entries[-1].to_dict() if entries else None


def _field_of(message: str) -> str:
    """The request field a library refusal is about (its message starts with it)."""
    first = message.split(" ", 1)[0]
    return (
        first
        if first in {"tenant", "limit", "plan", "rate", "until", "by", "units"}
        else ("rate" if "rate" in message else "limit")
    )
