"""``ratekeeper serve``: registers the subcommand on the CLI's argparse subparsers.

Importing this module imports nothing of the server extra; ``serve`` imports it when run, and
says which extra to install when it is missing.
"""

from __future__ import annotations

import argparse
import logging
import os
import signal
import socket
import sys
from typing import Any

SERVE_DESCRIPTION = """\
Run the rate-limit service: the HTTP JSON API and Envoy's gRPC rate-limit API.
Without --config it runs the built-in example policies on the memory store.
SIGHUP or POST /v1/admin/reload reloads the config; an invalid one is refused
and the running config stays.
"""
SERVE_EPILOG = """\
environment variables:
  RATEKEEPER_TOKEN        client bearer token: every /v1/ route (and gRPC with auth.grpc:
                          true) needs "Authorization: Bearer <token>"; at least 16 ASCII
                          characters, no spaces (default: unset)
  RATEKEEPER_ADMIN_TOKEN  admin bearer token: reset, reload, policy toggles, the
                          dashboard's switches; accepted wherever the client token is
                          (default: unset: admin routes are refused once a client
                          token is set)
  With neither token set, every route is open (for local use). A config's
  auth.token_env / auth.admin_token_env name other variables to read instead, and
  auth.token / auth.admin_token in the file take precedence over both.
  RATEKEEPER_<FLAG>       every flag, e.g. RATEKEEPER_PORT, RATEKEEPER_LOG_LEVEL,
                          RATEKEEPER_CONFIG (paths separated by ':'); RATEKEEPER_STORE: the
                          store's URL
  envoyproxy/ratelimit's  RUNTIME_ROOT, REDIS_URL, USE_STATSD, GRPC_PORT, ... read as
                          upstream does, with upstream's defaults (docs/deploy.md)
  A flag beats RATEKEEPER_..., which beats upstream's variable, which beats the default;
  ratekeeper check-config prints the effective settings and their sources.

signals:
  SIGHUP          reload the config (read in a thread; requests go on being answered);
                  ignored until the service serves; several at once cost one reload more;
                  under --workers, forwarded to every worker that serves
  SIGTERM, SIGINT stop accepting, finish the requests received (up to 5 s), exit 0

browser rules (every route):
  Host must name the listen address (loopback: localhost, 127.0.0.1, [::1]) or an
  --allowed-host (any name on 0.0.0.0 or :: unless some are given): else 400.
  A POST (or other non-GET method) is refused when it comes from another site
  (Sec-Fetch-Site: cross-site, or an Origin other than the Host and --allowed-origin: 403),
  or carries neither Content-Type: application/json nor an Authorization header (415).

exit status:
  0 when stopped (SIGTERM, SIGINT), also while starting; 2 for an invalid config, a port
  in use, a store that did not answer within --store-wait, or (--workers) a worker that
  could not start.

Check a config without starting: ratekeeper check-config PATH. Reference: docs/reference.md.
"""


def add_serve_command(subparsers: Any) -> argparse.ArgumentParser:
    """Add ``serve`` to ``parser.add_subparsers()``; it runs ``run_serve``."""
    parser: argparse.ArgumentParser = subparsers.add_parser(
        "serve",
        help="run the rate-limit service (HTTP JSON + Envoy gRPC)",
        description=SERVE_DESCRIPTION,
        epilog=SERVE_EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument(
        "--config",
        action="append",
        default=[],
        metavar="PATH",
        help="a YAML config file (ratekeeper's format or envoyproxy/ratelimit's), or a "
        "directory of them (watched, reloaded on change); repeat to merge several "
        "(default: the built-in example, memory store)",
    )
    parser.add_argument(
        "--config-dotfiles",
        action="store_true",
        help="read dot files in config directories too (default: skipped)",
    )
    parser.add_argument(
        "--host",
        default=None,
        help="address to listen on, HTTP and gRPC; 0.0.0.0 for every interface "
        "(default: 127.0.0.1)",
    )
    parser.add_argument(
        "--port", type=_port, default=None, help="HTTP port; 0 picks a free one (default: 8080)"
    )
    parser.add_argument(
        "--grpc-port",
        type=_port,
        default=None,
        metavar="PORT",
        help="gRPC port for Envoy's rate-limit API; 0 picks a free one (default: 8081)",
    )
    parser.add_argument(
        "--no-grpc", action="store_true", help="do not listen for gRPC (default: listen)"
    )
    parser.add_argument(
        "--grpc-threads",
        type=_threads,
        default=None,
        metavar="N",
        help="gRPC on the standard grpc.server with N handler threads (default: 0, grpc.aio "
        "on the event loop)",
    )
    parser.add_argument(
        "--store-wait",
        type=_seconds,
        default=None,
        metavar="SECONDS",
        help="at startup, wait this long for the store to answer, then exit with status 2 "
        "(default: 5)",
    )
    parser.add_argument(
        "--start-degraded",
        action="store_true",
        help="serve even if the store does not answer at startup: decisions fail open and "
        "/healthz answers 503 until it does (default: exit)",
    )
    parser.add_argument(
        "--header-timeout",
        type=_timeout,
        default=None,
        metavar="SECONDS",
        help="close an HTTP connection whose request's headers are not complete this long "
        "after it opened or after the previous answer (default: 10)",
    )
    parser.add_argument(
        "--body-timeout",
        type=_timeout,
        default=None,
        metavar="SECONDS",
        help="close an HTTP connection whose request's body is not complete this long after "
        "its headers (default: 10)",
    )
    parser.add_argument(
        "--idle-timeout",
        type=_timeout,
        default=None,
        metavar="SECONDS",
        help="close an HTTP connection that sends no byte of a request this long after it "
        "opened or after the previous answer, keep-alive (default: 5)",
    )
    parser.add_argument(
        "--send-timeout",
        type=_timeout,
        default=None,
        metavar="SECONDS",
        help="cut off an HTTP client that reads none of its answers this long while they "
        "wait (default: 10)",
    )
    parser.add_argument(
        "--max-connections",
        type=_count,
        default=None,
        metavar="N",
        help="most open HTTP connections; past it the one that waited longest for its "
        "headers is closed (default: the file-descriptor limit less 64)",
    )
    parser.add_argument(
        "--allowed-host",
        action="append",
        default=[],
        metavar="NAME",
        help="a Host name served besides the listen address's; repeat for more; * for any "
        "(default: the listen address; any name on 0.0.0.0 or ::)",
    )
    parser.add_argument(
        "--allowed-origin",
        action="append",
        default=[],
        metavar="ORIGIN",
        help="an origin (https://ops.example.com) whose pages may send state-changing "
        "requests; repeat for more (default: only the service's own)",
    )
    parser.add_argument(
        "--no-auth-warning",
        action="store_true",
        help="do not warn at startup when listening beyond loopback without tokens "
        "(/healthz still reports open_to_network) (default: warn)",
    )
    parser.add_argument(
        "--workers",
        type=_workers,
        default=None,
        metavar="N",
        help="worker processes sharing the ports; auto: one per core; more than one needs a "
        "shared store (Redis) (default: 1)",
    )
    parser.add_argument(
        "--worker-timeout",
        type=_timeout,
        default=None,
        metavar="SECONDS",
        help="with --workers: replace a worker whose event loop has not reported for this "
        "long (stopped or stuck) (default: 10)",
    )
    parser.add_argument(
        "--log-level",
        type=_level,
        default=None,
        metavar="LEVEL",
        help="debug, info, warn, error (default: warn: problems only; info adds start, stop "
        "and reloads)",
    )
    parser.add_argument(
        "--log-format",
        choices=("text", "json"),
        default=None,
        help="text: one line a record; json: one object a line (default: text)",
    )
    parser.add_argument(
        "--statsd",
        default=None,
        metavar="HOST:PORT",
        help="send envoyproxy/ratelimit's stats (ratelimit.service.rate_limit...) to this "
        "statsd over UDP (default: none)",
    )
    parser.add_argument(
        "--statsd-flush-interval",
        type=_seconds,
        default=None,
        metavar="SECONDS",
        help="seconds between statsd flushes (default: 10)",
    )
    # set by the supervisor for its workers
    parser.add_argument("--worker-index", type=int, default=None, help=argparse.SUPPRESS)
    parser.add_argument("--metrics-dir", default=None, help=argparse.SUPPRESS)
    parser.add_argument("--watch-interval", type=float, default=1.0, help=argparse.SUPPRESS)
    parser.add_argument("--heartbeat-fd", type=int, default=None, help=argparse.SUPPRESS)
    parser.set_defaults(func=run_serve)
    return parser


def run_serve(args: argparse.Namespace) -> int:
    """Start the service with the parsed arguments, completed from the environment."""
    from .lifecycle import ignore_hangups

    ignore_hangups()  # until it serves (server.serve)
    signal.signal(signal.SIGTERM, _stopped_while_starting)  # until it listens for it
    try:
        from .server import ServeOptions, serve
        from .supervisor import supervise
    except ImportError as exc:
        return missing_extra("serve", exc)
    from . import logs, statsd
    from .config import environment

    try:
        settings = environment.serve_settings(vars(args), os.environ)
    except environment.EnvironmentProblem as exc:
        print(f"ratekeeper serve: {exc}", file=sys.stderr)
        return 2
    for name, setting in settings.items():
        setattr(args, name, setting.value)
    worker = args.worker_index is not None
    tag = f"worker {args.worker_index}" if worker else "supervisor" if args.workers > 1 else ""
    logs.configure(args.log_level, args.log_format, tag)
    if args.statsd and not worker and not args.port:  # the sink reads /metrics: pick it now
        args.port = _free_port(args.host)
    options = ServeOptions(
        tuple(args.config),
        args.host,
        args.port,
        None if args.no_grpc else args.grpc_port,
        store_wait=args.store_wait,
        start_degraded=args.start_degraded,
        header_timeout=args.header_timeout,
        body_timeout=args.body_timeout,
        idle_timeout=args.idle_timeout,
        send_timeout=args.send_timeout,
        max_connections=args.max_connections,
        grpc_threads=args.grpc_threads,
        dotfiles=args.config_dotfiles,
        watch_interval=args.watch_interval,
        worker=args.worker_index,
        metrics_dir=args.metrics_dir,
        allowed_hosts=tuple(args.allowed_host),
        allowed_origins=tuple(args.allowed_origin),
        auth_warning=not args.no_auth_warning,
        worker_timeout=args.worker_timeout,
        heartbeat_fd=args.heartbeat_fd,
    )
    sink = None
    if args.statsd and not worker:
        local = "127.0.0.1" if args.host in ("0.0.0.0", "::", "") else args.host
        url = f"http://{'[' + local + ']' if ':' in local else local}:{args.port}/metrics"
        sink = statsd.StatsdSink(url, args.statsd, args.statsd_flush_interval)
        sink.start()
    log = logging.getLogger("ratekeeper.service")
    if not worker:
        log.info(
            "ratekeeper serve starting: HTTP %s:%s, gRPC %s, %d worker(s), config %s%s",
            args.host, args.port, "off" if args.no_grpc else args.grpc_port, args.workers,
            ", ".join(args.config) or "(built-in example)",
            f", statsd {args.statsd}" if args.statsd else "",
        )  # fmt: skip
    code = 2
    try:
        if args.workers > 1 and not worker:
            code = supervise(options, args.workers)
        else:
            code = serve(options)
        return code
    finally:
        if sink is not None:
            sink.stop()
        if not worker:
            log.info("ratekeeper serve stopped (exit status %d)", code)


def _free_port(host: str) -> int:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as probe:
        probe.bind((host, 0))
        port: int = probe.getsockname()[1]
    return port


def _stopped_while_starting(signum: int, frame: object) -> None:
    """SIGTERM before the service handles it (imports, config): exit 0, as it would later."""
    raise SystemExit(0)


def missing_extra(command: str, exc: ImportError) -> int:
    """Say which extra ``ratekeeper <command>`` needs; the exit status 2."""
    print(
        f"ratekeeper {command} needs the server extra ({exc.name} is missing): "
        "pip install 'ratekeeper[server]'",
        file=sys.stderr,
    )
    return 2


def _workers(text: str) -> int:
    if text == "auto":
        return os.cpu_count() or 1
    if not text.isdigit() or int(text) < 1:
        raise argparse.ArgumentTypeError(
            f"workers {text!r} is invalid; expected a whole number >= 1 or auto"
        )
    return int(text)


def _level(text: str) -> str:
    from .config.environment import LOG_LEVELS

    if text.lower() not in LOG_LEVELS:
        raise argparse.ArgumentTypeError(
            f"log level {text!r} is invalid; expected debug, info, warn, error or fatal"
        )
    return LOG_LEVELS[text.lower()]


def _threads(text: str) -> int:
    if not text.isdigit() or int(text) > 256:
        raise argparse.ArgumentTypeError(f"threads {text!r} is invalid; expected 0 to 256")
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
