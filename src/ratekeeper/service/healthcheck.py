"""``ratekeeper healthcheck``: ask a running service's health route, for a container's
HEALTHCHECK or an exec probe where no curl is installed. Exit 0 when it answers 200, else 1
with the reason on stderr. The port is ``--port``, else ``RATEKEEPER_PORT`` or ``PORT`` (as
``serve`` reads them), else 8080.
"""

from __future__ import annotations

import argparse
import os
import sys
import urllib.error
import urllib.request
from typing import Any


def add_healthcheck_command(subparsers: Any) -> argparse.ArgumentParser:
    """Add ``healthcheck`` to ``parser.add_subparsers()``."""
    parser: argparse.ArgumentParser = subparsers.add_parser(
        "healthcheck",
        help="ask a running service's /healthcheck (exit 0 when it answers 200)",
        description="Ask a running ratekeeper serve whether it is healthy: exit 0 when the "
        "route answers 200, 1 otherwise. For container health checks.",
    )
    parser.add_argument("--host", default="127.0.0.1", help="(default: 127.0.0.1)")
    parser.add_argument(
        "--port",
        type=int,
        default=None,
        help="the service's HTTP port (default: RATEKEEPER_PORT, else PORT, else 8080)",
    )
    parser.add_argument(
        "--path",
        default="/healthcheck",
        help="/healthcheck: the process serves; /healthz: its store answers too "
        "(default: /healthcheck)",
    )
    parser.add_argument("--timeout", type=float, default=2.0, help="seconds (default: 2)")
    parser.set_defaults(func=run_healthcheck)
    return parser


def run_healthcheck(args: argparse.Namespace) -> int:
    """GET the route; 0 on 200, else 1 (2: the port to ask is not a number)."""
    port = args.port
    if port is None:
        text = os.environ.get("RATEKEEPER_PORT") or os.environ.get("PORT") or "8080"
        if not text.isdigit():
            print(f"ratekeeper healthcheck: port {text!r} is not a number", file=sys.stderr)
            return 2  # a usage mistake, as every command's, not an unhealthy service
        port = int(text)
    url = f"http://{args.host}:{port}{args.path}"
    try:
        with urllib.request.urlopen(url, timeout=args.timeout) as response:
            status = int(response.status)
    except urllib.error.HTTPError as exc:
        status = exc.code
    except OSError as exc:
        print(f"ratekeeper healthcheck: {url}: {exc}", file=sys.stderr)
        return 1
    if status != 200:
        print(f"ratekeeper healthcheck: {url} answered {status}", file=sys.stderr)
        return 1
    return 0
