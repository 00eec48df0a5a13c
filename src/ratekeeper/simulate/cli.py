"""``ratekeeper simulate``: registers the subcommand; imports the simulator only when run."""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from ..errors import ConfigError, RatekeeperError


def add_simulate_command(subparsers: Any) -> argparse.ArgumentParser:
    """Add ``simulate`` to ``parser.add_subparsers()``."""
    p: argparse.ArgumentParser = subparsers.add_parser(
        "simulate",
        help="replay a traffic log through candidate limits and report what they would do",
        description=(
            "Replay access logs through limits on a simulated clock, with the code that "
            "enforces them, and report would-be rejections, keys, peak usage and suggested "
            "limits. Limits come from middleware checks (--checks module:attr), the service's "
            "YAML (--config with --key/--descriptor), or --limit."
        ),
    )
    p.add_argument("logs", nargs="+", metavar="LOG", help="log files (gzip ok); - for stdin")
    src = p.add_argument_group("limits")
    src.add_argument("--checks", metavar="MODULE:ATTR", help="middleware checks to import")
    src.add_argument("--config", action="append", default=[], metavar="FILE",
                     help="the service's YAML (repeatable)")  # fmt: skip
    src.add_argument("--key", action="append", default=[], metavar="POLICY=FIELD",
                     help="key a service policy by a log field, e.g. api.core=ip")  # fmt: skip
    src.add_argument("--descriptor", action="append", default=[],
                     metavar="DOMAIN=KEY:FIELD,...",
                     help="Envoy descriptor entries from log fields, "
                     "e.g. edge=remote_address:ip")  # fmt: skip
    src.add_argument("--limit", action="append", default=[], metavar="NAME=RATE",
                     help="a candidate limit, e.g. per-ip=100/minute "
                     "(keyed by --key-field)")  # fmt: skip
    src.add_argument("--key-field", default="ip", help="the field --limit keys on (default ip)")
    src.add_argument("--algorithm", default="fixed_window", help="algorithm of --limit")
    src.add_argument("--mode", choices=("enforce", "shadow"), default="enforce",
                     help="checks: enforce (a rejection stops the walk) or shadow (each "
                     "check sees every request)")  # fmt: skip
    fmt = p.add_argument_group("input")
    fmt.add_argument("--format", default="auto", choices=("auto", "combined", "jsonl", "csv"))
    fmt.add_argument("--time-field", help="JSON/CSV field holding the time")
    fmt.add_argument("--field", action="append", default=[], metavar="NAME=SOURCE",
                     help="take field NAME (ip, user, path, ...) from SOURCE")  # fmt: skip
    out = p.add_argument_group("report")
    out.add_argument("--share", type=float, default=0.001,
                     help="suggest the smallest rate limiting at most this share "
                     "of keys")  # fmt: skip
    out.add_argument("--algorithms", default="",
                     help="comma-separated algorithms to suggest limits for (default: each "
                     "limit's own)")  # fmt: skip
    out.add_argument("--no-suggest", action="store_true", help="skip peak usage and suggestions")
    out.add_argument("--top", type=int, default=10, help="top keys to list per limit")
    out.add_argument("--json", nargs="?", const="-", metavar="FILE", help="write JSON")
    out.add_argument("--html", metavar="FILE", help="write a self-contained HTML report")
    prog = out.add_mutually_exclusive_group()
    prog.add_argument("--progress", action="store_true", default=None, help="progress on stderr")
    prog.add_argument("--no-progress", dest="progress", action="store_false")
    p.set_defaults(func=run_simulate)
    return p


def _pairs(values: list[str], what: str, sep: str = "=") -> dict[str, str]:
    out = {}
    for v in values:
        name, found, rest = v.partition(sep)
        if not found or not name or not rest:
            raise ConfigError(f"{what} {v!r} is invalid; expected NAME{sep}VALUE")
        out[name] = rest
    return out


def build(args: argparse.Namespace) -> tuple[Any, str]:
    """The target the arguments name, and its mode."""
    from ..clock import ManualClock
    from .targets import CandidatesTarget, ChecksTarget, ServiceTarget, load_checks

    clock = ManualClock(0.0)
    chosen = sum(bool(x) for x in (args.checks, args.config, args.limit))
    if chosen != 1:
        raise ConfigError("give exactly one source of limits: --checks, --config or --limit")
    if args.checks:
        return ChecksTarget(load_checks(args.checks), clock, args.mode), args.mode
    if args.limit:
        limits = _pairs(args.limit, "--limit")
        return CandidatesTarget(limits, args.key_field, args.algorithm, clock), "candidates"
    try:
        from ..service import config as config_mod
    except ImportError as exc:
        raise ConfigError(
            f"--config needs the server extra ({exc.name} is missing): "
            "pip install 'ratekeeper[server]'"
        ) from None
    descriptors = {}
    for domain, spec in _pairs(args.descriptor, "--descriptor").items():
        descriptors[domain] = list(_pairs(spec.split(","), "descriptor entry", ":").items())
    config = config_mod.load(args.config)
    return ServiceTarget(config, _pairs(args.key, "--key"), descriptors, clock), "service"


def run_simulate(args: argparse.Namespace) -> int:
    """Run the replay and write the reports."""
    from . import html, render
    from .replay import Options, progress_stream, replay

    try:
        if not 0 <= args.share < 1:
            raise ConfigError(f"--share {args.share!r} is invalid; expected 0 <= share < 1")
        algorithms = [a for a in args.algorithms.split(",") if a]
        from ..algorithms import ALGORITHMS

        for a in algorithms:
            if a not in ALGORITHMS:
                raise ConfigError(
                    f"algorithm {a!r} is unknown; expected one of {', '.join(sorted(ALGORITHMS))}"
                )
        target, mode = build(args)
        options = Options(
            args.logs, args.format, args.time_field, _pairs(args.field, "--field"),
            args.share, algorithms, args.top, not args.no_suggest,
        )  # fmt: skip
        report = replay(target, options, mode, progress_stream(args.progress))
    except RatekeeperError as exc:  # ConfigError, RateSpecError: they name the bad value
        print(f"ratekeeper simulate: {exc}", file=sys.stderr)
        return 2
    if args.html:
        with open(args.html, "w", encoding="utf-8") as f:
            f.write(html.page(report))
    if args.json == "-":
        json.dump(report.to_json(), sys.stdout, indent=1)
        sys.stdout.write("\n")
    else:
        if args.json:
            with open(args.json, "w", encoding="utf-8") as f:
                json.dump(report.to_json(), f, indent=1)
        sys.stdout.write(render.text(report))
    return 0
