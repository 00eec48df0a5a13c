"""``ratekeeper admin``: a caller's status and support's admin operations, from a shell.

Two ways, the same operations and answers (``http.quotas``):

- against a running service: ``--url http://host:port`` with the admin token
  (``--token`` or ``RATEKEEPER_ADMIN_TOKEN``); the service writes the audit entry;
- directly against the store: ``--config ratekeeper.yaml`` (the service's config files: its
  store, its policies and its ``quotas:``), or ``--store URL --plans plans.yaml``; the audit
  entry goes where the config sends it, and to the ``ratekeeper.audit`` log on stderr.

The answer is printed as JSON; a refusal prints its message on stderr and exits 1 (2 for a
usage or config mistake).
"""

from __future__ import annotations

import argparse
import asyncio
import getpass
import json
import logging
import os
import socket
import sys
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

from ..errors import BadRequest, ConfigError

ADMIN_DESCRIPTION = """\
Show a caller's limits, reset, credit or debit its counters, override a tenant's limit or
move it to another plan - through a running service (--url) or directly on the store
(--config, or --store with --plans). Every change is written to the audit log.

  ratekeeper admin --url http://127.0.0.1:8080 status acme
  ratekeeper admin --url http://127.0.0.1:8080 credit acme plan:api 500 --by alice
  ratekeeper admin --config ratekeeper.yaml reset acme search --by alice
"""


def add_admin_command(subparsers: Any) -> argparse.ArgumentParser:
    """Add ``admin`` to ``parser.add_subparsers()``; it runs ``run_admin``."""
    parser: argparse.ArgumentParser = subparsers.add_parser(
        "admin",
        help="a caller's limits, and reset/credit/debit/override/plan changes (audited)",
        description=ADMIN_DESCRIPTION,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    where = parser.add_mutually_exclusive_group(required=True)
    where.add_argument("--url", help="a running service (http://host:port)")
    where.add_argument(
        "--config", action="append", metavar="PATH", help="the service's config file(s)"
    )
    where.add_argument("--store", metavar="URL", help="a Redis store (redis://host:port/db)")
    parser.add_argument("--plans", metavar="FILE", help="with --store: the plans file")
    parser.add_argument("--prefix", default="rk", help="with --store: its key prefix (rk)")
    parser.add_argument("--token", help="with --url: the admin token (RATEKEEPER_ADMIN_TOKEN)")
    parser.add_argument("--by", default="", help="who asks, for the audit log")
    parser.add_argument("--reason", default="", help="why, for the audit log")
    actions = parser.add_subparsers(dest="action", required=True, metavar="ACTION")
    actions.add_parser("status", help="every limit of KEY").add_argument("key")
    for name in ("reset", "credit", "debit"):
        sub = actions.add_parser(name, help=f"{name} KEY's counters of LIMIT")
        sub.add_argument("key")
        sub.add_argument("limit", help="a policy's name, or a plan's limit (plan:<name>)")
        if name != "reset":
            sub.add_argument("units", type=int)
    sub = actions.add_parser("override", help="count TENANT's LIMIT at RATE")
    sub.add_argument("tenant")
    sub.add_argument("limit")
    sub.add_argument("rate")
    sub.add_argument("--until", help="epoch seconds or ISO 8601 with offset (default: none)")
    sub = actions.add_parser("clear-override", help="end TENANT's override of LIMIT")
    sub.add_argument("tenant")
    sub.add_argument("limit")
    sub = actions.add_parser("plan", help="move TENANT to PLAN ('default': the default)")
    sub.add_argument("tenant")
    sub.add_argument("plan")
    actions.add_parser("audit", help="the latest audit entries").add_argument(
        "--count", default="20"
    )
    parser.set_defaults(func=run_admin)
    return parser


def request_of(args: argparse.Namespace) -> tuple[str, dict[str, Any] | None, str]:
    """(method and path with its query, JSON body or None, action) of the arguments."""
    action = args.action
    if action == "status":
        return "GET /v1/status?" + _q("key", args.key), None, action
    if action == "audit":
        return "GET /v1/admin/quotas/audit?" + _q("count", args.count), None, action
    body: dict[str, Any] = {}
    if args.by:
        body["by"] = args.by
    if args.reason:
        body["reason"] = args.reason
    if action in ("reset", "credit", "debit"):
        body |= {"key": args.key, "limit": args.limit}
        if action != "reset":
            body["units"] = args.units
    elif action == "plan":
        body |= {"tenant": args.tenant, "plan": None if args.plan == "default" else args.plan}
    else:
        body |= {"tenant": args.tenant, "limit": args.limit}
        if action == "override":
            body["rate"] = args.rate
            if args.until is not None:
                until = args.until
                body["until"] = float(until) if _number(until) else until
    return "POST /v1/admin/quotas/" + action, body, action


def run_admin(args: argparse.Namespace) -> int:
    """Run one admin action; print its answer as JSON."""
    target, body, _ = request_of(args)
    if args.url:
        status, answer = _over_http(args, target, body)
    else:
        try:
            status, answer = asyncio.run(_direct(args, target, body))
        except ConfigError as exc:
            print(f"ratekeeper admin: {exc}", file=sys.stderr)
            return 2
    if status >= 400:
        print(f"ratekeeper admin: {status}: {answer.get('error', answer)}", file=sys.stderr)
        return 1
    print(json.dumps(answer, indent=1, sort_keys=True))
    return 0


def _over_http(
    args: argparse.Namespace, target: str, body: dict[str, Any] | None
) -> tuple[int, Any]:
    method, path = target.split(" ", 1)
    token = args.token or os.environ.get("RATEKEEPER_ADMIN_TOKEN", "")
    headers = {"content-type": "application/json"}
    if token:
        headers["authorization"] = f"Bearer {token}"
    data = None if body is None else json.dumps(body).encode()
    request = urllib.request.Request(
        args.url.rstrip("/") + path, data=data, headers=headers, method=method
    )
    try:
        with urllib.request.urlopen(request, timeout=30) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as exc:
        try:
            return exc.code, json.loads(exc.read())
        except ValueError:
            return exc.code, {"error": exc.reason}
    except (urllib.error.URLError, OSError) as exc:
        return 503, {"error": f"cannot reach {args.url}: {exc}"}


async def _direct(
    args: argparse.Namespace, target: str, body: dict[str, Any] | None
) -> tuple[int, Any]:
    """The action on the store itself, through the service's own engine and routes."""
    from ..limiter import AsyncLimiter
    from .config import loader as config_mod
    from .engine import Engine
    from .http import quotas as quota_routes
    from .metrics import Metrics
    from .server import build_store

    logging.basicConfig(level=logging.INFO, format="%(name)s: %(message)s", stream=sys.stderr)
    if args.config:
        config = config_mod.load(args.config)
    else:
        if not args.plans:
            raise ConfigError("--store needs --plans (the plans file)")
        plans = str(Path(args.plans).resolve())
        text = f"store: {{url: {json.dumps(args.store)}, prefix: {json.dumps(args.prefix)}}}\n"
        text += f"quotas: {{plans: {json.dumps(plans)}}}\n"
        config = config_mod.parse_text(text, "<--store>")
    metrics = Metrics()
    store, _, _ = build_store(config.store, metrics)
    engine = Engine(config, AsyncLimiter(store, fail_open=False), metrics)
    path_query = target.split(" ", 1)[1]
    path, _, query = path_query.partition("?")
    who = f"{getpass.getuser()}@{socket.gethostname()}"
    scope = {"query_string": query.encode(), "who": f"ratekeeper admin on the store, {who}"}
    try:
        return await quota_routes.answer(engine, path, scope, body)
    except BadRequest as exc:
        return exc.status, {"error": str(exc), "field": exc.field}
    finally:
        engine.plans.close()


def _q(name: str, value: str) -> str:
    from urllib.parse import quote

    return f"{name}={quote(value, safe='')}"


def _number(text: str) -> bool:
    try:
        float(text)
    except ValueError:
        return False
    return True
