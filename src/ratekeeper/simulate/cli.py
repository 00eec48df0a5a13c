"""``ratekeeper simulate``: registers the subcommand; imports the simulator only when run.

Exit status (docs/simulate.md, "Exit status", is where users read it): 0 when the replay
ran; 2 for a bad argument (named); 1 when the logs gave nothing to trust — no request
parsed, most lines unparsable, a limit's key field missing on most requests, or lines that
could not be put in time order as asked (``LogOrderError``) — with a message saying which
and what to try.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from typing import Any

from ..errors import ConfigError, LogOrderError, RatekeeperError

FORMATS = (
    "auto", "combined", "common", "traefik", "w3c", "iis", "cloudfront", "alb", "csv",
    "caddy", "traefik-json", "cloudflare", "jsonl",
)  # fmt: skip
"""``formats.FORMATS`` (tests/simulate check they agree), here so that ``--help`` imports
nothing of the simulator."""


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
    p.add_argument("logs", nargs="+", metavar="LOG",
                   help="log files (gzip ok, any order); - for stdin")  # fmt: skip
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
    src.add_argument("--limit", action="append", default=[],
                     metavar="NAME=RATE[,key=FIELD][,algorithm=NAME][,burst=N][,buckets=N]",
                     help="a candidate limit, e.g. per-ip=100/minute or "
                     "login=5/minute,key=user,algorithm=gcra (repeatable)")  # fmt: skip
    src.add_argument("--key-field", default="ip",
                     help="the field a --limit keys on unless it says (default ip)")  # fmt: skip
    src.add_argument("--algorithm", default="fixed_window",
                     help="the algorithm of a --limit unless it says")  # fmt: skip
    src.add_argument("--mode", choices=("enforce", "shadow"), default="enforce",
                     help="checks: enforce (a rejection stops the walk) or shadow (each "
                     "check sees every request)")  # fmt: skip
    fmt = p.add_argument_group("input")
    fmt.add_argument("--format", default="auto", choices=FORMATS,
                     help="the logs' format (default: detected from a sample of each)")  # fmt: skip
    fmt.add_argument("--time-field", help="the field holding the time (dotted for nested JSON)")
    fmt.add_argument("--field", action="append", default=[], metavar="NAME=SOURCE",
                     help="take field NAME (ip, user, path, ...) from SOURCE, e.g. "
                     "ip=request.remote_ip")  # fmt: skip
    fmt.add_argument("--skew", default="3m", metavar="DURATION",
                     help="how far a line may lag the newest line of its file and still be "
                     "streamed in time order, e.g. 90s, 3m (default)")  # fmt: skip
    fmt.add_argument("--late", choices=("sort", "skip", "refuse"), default="sort",
                     help="a line further behind than --skew: sort every line (default; "
                     "the logs are read again), skip such lines (a report on part of the "
                     "logs), or refuse (exit 1)")  # fmt: skip
    fmt.add_argument("--max-line", type=int, default=None, metavar="CHARS",
                     help="longer lines are counted bad, not read (default 65536)")  # fmt: skip
    out = p.add_argument_group("report")
    out.add_argument("--share", type=float, default=0.001,
                     help="suggest the smallest rate limiting at most this share "
                     "of keys")  # fmt: skip
    out.add_argument("--reject-share", type=float, default=None, metavar="SHARE",
                     help="also suggest the smallest rate rejecting at most this share of "
                     "requests, e.g. 0.01")  # fmt: skip
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
        if name in out:
            raise ConfigError(f"{what} {name!r} is given twice; each name once")
        out[name] = rest
    return out


LIMIT_OPTIONS = ("key", "algorithm", "burst", "buckets")


def parse_limits(values: list[str], key: str, algorithm: str) -> dict[str, Any]:
    """``--limit NAME=RATE[,key=FIELD][,algorithm=NAME][,burst=N][,buckets=N]`` ->
    ``Candidate``s by name; a name given twice or an unknown option is refused."""
    from .targets import Candidate

    out: dict[str, Candidate] = {}
    for value in values:
        name, found, spec = value.partition("=")
        if not found or not name or not spec:
            raise ConfigError(f"--limit {value!r} is invalid; expected NAME=RATE[,key=FIELD,...]")
        if name in out:
            raise ConfigError(f"--limit {name!r} is given twice; give each candidate a name")
        rate, *options = spec.split(",")
        given: dict[str, str] = {}
        for option in options:
            k, eq, v = option.partition("=")
            if not eq or k not in LIMIT_OPTIONS or not v:
                raise ConfigError(
                    f"--limit {name}: option {option!r} is invalid; expected one of "
                    f"{', '.join(o + '=...' for o in LIMIT_OPTIONS)}"
                )
            given[k] = v
        numbers = {}
        for k in ("burst", "buckets"):
            if k in given:
                if not given[k].isdigit():
                    raise ConfigError(f"--limit {name}: {k}={given[k]!r} is not a whole number")
                numbers[k] = int(given[k])
        out[name] = Candidate(
            rate, given.get("key", key), given.get("algorithm", algorithm), **numbers
        )
    return out


def parse_duration(text: str) -> float:
    """``90``, ``90s``, ``3m``, ``1h`` -> seconds."""
    m = re.fullmatch(r"(\d+(?:\.\d+)?)\s*([smh]?)", text.strip())
    if m is None:
        raise ConfigError(f"--skew {text!r} is invalid; expected a duration such as 90s or 3m")
    return float(m.group(1)) * {"": 1, "s": 1, "m": 60, "h": 3600}[m.group(2)]


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
        limits = parse_limits(args.limit, args.key_field, args.algorithm)
        return CandidatesTarget(limits, args.key_field, args.algorithm, clock), "candidates"
    try:
        from ..service.config import loader as config_mod
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
    from .output import html, render
    from .output.report import trouble
    from .reading.lines import MAX_LINE
    from .replay import Options, progress_stream, replay

    try:
        if not 0 <= args.share < 1:
            raise ConfigError(f"--share {args.share!r} is invalid; expected 0 <= share < 1")
        if args.reject_share is not None and not 0 <= args.reject_share < 1:
            raise ConfigError(
                f"--reject-share {args.reject_share!r} is invalid; expected 0 <= share < 1"
            )
        algorithms = [a for a in args.algorithms.split(",") if a]
        from ..algorithms import ALGORITHMS

        for a in algorithms:
            if a not in ALGORITHMS:
                raise ConfigError(
                    f"algorithm {a!r} is unknown; expected one of {', '.join(sorted(ALGORITHMS))}"
                )
        if args.max_line is not None and args.max_line < 1:
            raise ConfigError(f"--max-line {args.max_line!r} is invalid; expected >= 1")
        target, mode = build(args)
        options = Options(
            args.logs, args.format, args.time_field, _pairs(args.field, "--field"),
            args.share, algorithms, args.top, not args.no_suggest,
            window=parse_duration(args.skew), max_line=args.max_line or MAX_LINE,
            late=args.late, reject_share=args.reject_share,
        )  # fmt: skip
        report = replay(target, options, mode, progress_stream(args.progress))
    except LogOrderError as exc:  # nothing to report: the message names the fixes
        print(f"ratekeeper simulate: {exc}", file=sys.stderr)
        return 1
    except OSError as exc:  # the suggestions' spool or a copy could not be written
        import tempfile

        where = exc.filename or f"temporary files in {tempfile.gettempdir()}"
        print(
            f"ratekeeper simulate: cannot write {where} ({exc.strerror or exc}): nothing is "
            "reported. Set TMPDIR to a directory with room, or leave out the suggestions "
            "(--no-suggest), whose requests wait there.",
            file=sys.stderr,
        )
        return 1
    except RatekeeperError as exc:  # ConfigError, RateSpecError: they name the bad value
        print(f"ratekeeper simulate: {exc}", file=sys.stderr)
        return 2
    data = report.to_json()
    problem = trouble(data)
    if data["parsed"]:
        if args.html:
            with open(args.html, "w", encoding="utf-8") as f:
                f.write(html.page(data))
        if args.json and args.json != "-":
            with open(args.json, "w", encoding="utf-8") as f:
                json.dump(data, f, indent=1)
    if args.json == "-":
        json.dump(data, sys.stdout, indent=1)
        sys.stdout.write("\n")
        for line in render.detected(data):
            print(line, file=sys.stderr)
    else:
        sys.stdout.write(render.text(data))
    if problem is not None:
        print(f"ratekeeper simulate: {problem}", file=sys.stderr)
        return 1
    return 0
