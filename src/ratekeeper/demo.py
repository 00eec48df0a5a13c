"""``ratekeeper demo``: the same burst of traffic against every algorithm, on the memory store.

Belongs here: the demo's traffic model, its run (a ``Limiter`` on a ``MemoryStore`` driven by a
``ManualClock``, so the output is the same on every run and machine) and its text report, plus
``add_demo_command`` that plugs it into the CLI. Nothing here sleeps or touches the network.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from .clock import ManualClock
from .decision import Decision
from .errors import RatekeeperError
from .limiter import Limiter
from .stores.memory import MemoryStore

START = 1_700_000_040.0
"""The simulated clock's start: an epoch second on a minute boundary (2023-11-14 22:14 UTC)."""

ORDER = ("fixed_window", "sliding_window", "sliding_log", "token_bucket", "gcra")


@dataclass(frozen=True, slots=True)
class Traffic:
    """``burst`` requests at t=0, then one every ``every`` seconds until ``until`` seconds."""

    rate: str
    burst: int
    every: float
    until: float

    def times(self) -> list[float]:
        """Offsets in seconds from the start, one per request."""
        later = []
        t = self.every
        while t <= self.until + 1e-9:
            later.append(round(t, 3))
            t += self.every
        return [0.0] * self.burst + later


@dataclass(frozen=True, slots=True)
class Run:
    """One algorithm's answers to the traffic, in order: (offset in seconds, decision)."""

    algorithm: str
    answers: tuple[tuple[float, Decision], ...]


def run(traffic: Traffic, algorithms: Sequence[str]) -> list[Run]:
    """Send the traffic to each algorithm, each on a fresh memory store and clock."""
    runs = []
    for name in algorithms:
        clock = ManualClock(START)
        limiter = Limiter(store=MemoryStore(), clock=clock)
        answers = []
        for offset in traffic.times():
            clock.set(START + offset)
            answers.append((offset, limiter.hit("demo-client", traffic.rate, algorithm=name)))
        runs.append(Run(name, tuple(answers)))
    return runs


def report(traffic: Traffic, runs: Sequence[Run]) -> str:
    """The demo's text: a summary table, then the headers a client saw at key moments.

    The headers shown are the first rejection's (or the first request's if none was
    rejected) and the last request's; ``X-RateLimit-Reset`` is in simulated epoch seconds.
    """
    lines = [
        f"ratekeeper demo: one client limited to {traffic.rate}, the same traffic against "
        "each algorithm",
        f"(memory store, simulated clock; {traffic.burst} requests at t=0s, then one every "
        f"{traffic.every:g}s until t={traffic.until:g}s)",
        "",
        f"{'algorithm':<16}{'burst at t=0':<16}{'afterwards':<14}timeline (# admitted, . rejected)",
    ]
    for r in runs:
        head, tail = r.answers[: traffic.burst], r.answers[traffic.burst :]
        marks = "".join("#" if d.allowed else "." for _, d in r.answers)
        lines.append(
            f"{r.algorithm:<16}{_count(head):<16}{_count(tail):<14}"
            f"{marks[: traffic.burst]} {marks[traffic.burst :]}"
        )
    for r in runs:
        lines += ["", f"== {r.algorithm}"]
        rejected = next(((t, d) for t, d in r.answers if not d.allowed), None)
        first = (
            ("first request", r.answers[0]) if rejected is None else ("first rejection", rejected)
        )
        moments = [first, ("last request", r.answers[-1])]
        for label, (t, d) in moments:
            verdict = "admitted" if d.allowed else "rejected (429)"
            lines.append(f"  {label}, t={t:g}s: {verdict}")
            lines += [f"    {k}: {v}" for k, v in d.headers().items()]
    return "\n".join(lines) + "\n"


def _count(answers: Sequence[tuple[float, Decision]]) -> str:
    return f"{sum(d.allowed for _, d in answers)} of {len(answers)}"


def add_demo_command(subparsers: Any) -> argparse.ArgumentParser:
    """Add ``demo`` to ``parser.add_subparsers()``; it runs ``run_demo``."""
    parser: argparse.ArgumentParser = subparsers.add_parser(
        "demo",
        help="show each algorithm's answers to the same burst of traffic (memory store)",
        description=(
            "Send the same traffic to every algorithm on the in-memory store, with a simulated "
            "clock (the output is the same on every run), and print what was admitted and "
            "rejected and the headers a client would see."
        ),
    )
    parser.add_argument("--rate", default="10/minute", help="the limit, e.g. '10/minute'")
    parser.add_argument("--burst", type=_count_arg, default=15, help="requests at t=0")
    parser.add_argument(
        "--every", type=_seconds_arg, default=5.0, help="seconds between later requests"
    )
    parser.add_argument(
        "--until", type=_seconds_arg, default=90.0, help="seconds of traffic after t=0"
    )
    parser.add_argument(
        "--algorithm",
        action="append",
        choices=ORDER,
        help="only this algorithm (repeatable; default: all five)",
    )
    parser.set_defaults(func=run_demo)
    return parser


def run_demo(args: argparse.Namespace) -> int:
    """Run the demo with the parsed arguments and print its report."""
    traffic = Traffic(args.rate, args.burst, args.every, args.until)
    if args.until / args.every > 10_000:
        print(
            f"ratekeeper demo: --until {args.until:g} / --every {args.every:g} is "
            f"{args.until / args.every:.0f} requests; expected at most 10000",
            file=sys.stderr,
        )
        return 2
    try:
        runs = run(traffic, args.algorithm or ORDER)
    except RatekeeperError as exc:
        print(f"ratekeeper demo: {exc}", file=sys.stderr)
        return 2
    sys.stdout.write(report(traffic, runs))
    return 0


def _count_arg(text: str) -> int:
    if not text.isascii() or not text.isdigit() or not 1 <= int(text) <= 10_000:
        raise argparse.ArgumentTypeError(f"{text!r} is invalid; expected 1 to 10000 requests")
    return int(text)


def _seconds_arg(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = -1.0
    if not 0.001 <= value <= 86_400:
        raise argparse.ArgumentTypeError(f"{text!r} is invalid; expected 0.001 to 86400 seconds")
    return value
