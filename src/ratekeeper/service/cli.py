"""``ratekeeper serve``: registers the subcommand on the CLI's argparse subparsers.

Importing this module imports nothing of the server extra; ``serve`` imports it when run, and
says which extra to install when it is missing.
"""

from __future__ import annotations

import argparse
import os
import sys
from typing import Any


def add_serve_command(subparsers: Any) -> argparse.ArgumentParser:
    """Add ``serve`` to ``parser.add_subparsers()``; it runs ``run_serve``."""
    parser: argparse.ArgumentParser = subparsers.add_parser(
        "serve",
        help="run the rate-limit service (HTTP JSON + Envoy gRPC)",
        description=(
            "Run the rate-limit service. Without --config it uses the memory store and a "
            "built-in example policy file. SIGHUP reloads the config."
        ),
    )
    parser.add_argument(
        "--config",
        action="append",
        default=[],
        metavar="PATH",
        help="YAML config file (ours or Envoy ratelimit's), or a directory of them (watched "
        "and reloaded on change); repeat to merge several",
    )
    parser.add_argument(
        "--config-dotfiles",
        action="store_true",
        help="read dot files in config directories too (skipped by default)",
    )
    parser.add_argument("--host", default="127.0.0.1", help="address to listen on")
    parser.add_argument("--port", type=_port, default=8080, help="HTTP port (0: any free)")
    parser.add_argument(
        "--grpc-port", type=_port, default=8081, help="gRPC port for Envoy's RLS API (0: any free)"
    )
    parser.add_argument("--no-grpc", action="store_true", help="do not start the gRPC listener")
    parser.add_argument(
        "--store-wait",
        type=_seconds,
        default=5.0,
        metavar="SECONDS",
        help="wait this long at startup for the store to answer, then exit 2 (default 5)",
    )
    parser.add_argument(
        "--start-degraded",
        action="store_true",
        help="serve even if the store does not answer: fail open, /healthz 503 until it does",
    )
    parser.add_argument(
        "--header-timeout",
        type=_timeout,
        default=10.0,
        metavar="SECONDS",
        help="close a connection that takes longer to send its request headers (default 10)",
    )
    parser.add_argument(
        "--max-connections",
        type=_count,
        default=None,
        metavar="N",
        help="most open HTTP connections; past it the longest-idle one is closed "
        "(default: the file-descriptor limit less 64)",
    )
    parser.add_argument(
        "--workers",
        type=_workers,
        default=1,
        metavar="N",
        help="worker processes sharing the ports (default 1; auto: one per core); more than "
        "one needs a shared store (Redis)",
    )
    # set by the supervisor for its workers
    parser.add_argument("--worker-index", type=int, default=None, help=argparse.SUPPRESS)
    parser.add_argument("--metrics-dir", default=None, help=argparse.SUPPRESS)
    parser.add_argument("--watch-interval", type=float, default=1.0, help=argparse.SUPPRESS)
    parser.set_defaults(func=run_serve)
    return parser


def run_serve(args: argparse.Namespace) -> int:
    """Start the service with the parsed arguments."""
    try:
        from .server import ServeOptions, serve
        from .supervisor import supervise
    except ImportError as exc:
        print(
            f"ratekeeper serve needs the server extra ({exc.name} is missing): "
            "pip install 'ratekeeper[server]'",
            file=sys.stderr,
        )
        return 2
    options = ServeOptions(
        tuple(args.config),
        args.host,
        args.port,
        None if args.no_grpc else args.grpc_port,
        store_wait=args.store_wait,
        start_degraded=args.start_degraded,
        header_timeout=args.header_timeout,
        max_connections=args.max_connections,
        dotfiles=args.config_dotfiles,
        watch_interval=args.watch_interval,
        worker=args.worker_index,
        metrics_dir=args.metrics_dir,
    )
    if args.workers > 1 and args.worker_index is None:
        return supervise(options, args.workers)
    return serve(options)


def _workers(text: str) -> int:
    if text == "auto":
        return os.cpu_count() or 1
    if not text.isdigit() or int(text) < 1:
        raise argparse.ArgumentTypeError(
            f"workers {text!r} is invalid; expected a whole number >= 1 or auto"
        )
    return int(text)


def _port(text: str) -> int:
    if not text.isdigit() or not 0 <= int(text) <= 65535:
        raise argparse.ArgumentTypeError(f"port {text!r} is invalid; expected 0 to 65535")
    return int(text)


def _seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = -1.0
    if not 0 <= value <= 3600:
        raise argparse.ArgumentTypeError(f"{text!r} is invalid; expected seconds, 0 to 3600")
    return value


def _count(text: str) -> int:
    if not text.isdigit() or not 1 <= int(text) <= 1_000_000:
        raise argparse.ArgumentTypeError(f"{text!r} is invalid; expected a whole number >= 1")
    return int(text)


def _timeout(text: str) -> float:
    value = _seconds(text)
    if value <= 0:
        raise argparse.ArgumentTypeError(f"{text!r} is invalid; expected seconds > 0")
    return value
