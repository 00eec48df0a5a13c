"""``simulate``: read the logs, set the clock from each line, let the target decide, report.

The clock is a ``ManualClock`` set to each line's time; lines are replayed in file order (a
line older than the one before is decided at its own time, as a server with a lagging clock
would be). A target keyed on one field (``decide_run``, the candidates) is given runs of
lines of one time with that field of each (``LogReader.runs``); the others are given each
line's ``Entry``. The report is plain data (``Report.to_json``), rendered by ``render``.
"""

from __future__ import annotations

import math
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import IO, Any

from ..clock import ManualClock
from .logs import LogReader, LogStats, open_log
from .stats import LimitStats
from .suggest import quantiles, suggest

DEFAULT_SHARE = 0.001
PROGRESS_LINES = 65536
"""Lines between updates of the progress bar."""


@dataclass(frozen=True, slots=True)
class Options:
    """How to read the logs and what to report."""

    logs: Sequence[str]
    fmt: str = "auto"
    time_field: str | None = None
    aliases: dict[str, str] = field(default_factory=dict)
    share: float = DEFAULT_SHARE
    algorithms: Sequence[str] = ()
    """Algorithms to suggest limits for; empty: each limit's own."""
    top: int = 10
    suggest: bool = True
    progress: bool = False


@dataclass(slots=True)
class Report:
    """Everything ``simulate`` found."""

    log: LogStats
    limits: list[LimitStats]
    left_out: list[str]
    mode: str
    share: float
    elapsed: float
    first: float | None
    last: float | None
    suggestions: dict[str, list[dict[str, Any]]] = field(default_factory=dict)
    top: int = 10
    suggest_seconds: float = 0.0

    def to_json(self) -> dict[str, Any]:
        """The report as JSON-ready data (what ``--json`` prints)."""
        return {
            "lines": self.log.lines,
            "parsed": self.log.parsed,
            "unparsable": self.log.unparsable,
            "unparsable_samples": [
                {"line": n, "text": t, "why": w} for n, t, w in self.log.samples
            ],
            "first": self.first,
            "last": self.last,
            "mode": self.mode,
            "share": self.share,
            "seconds": round(self.elapsed, 3),
            "suggest_seconds": round(self.suggest_seconds, 3),
            "lines_per_second": round(self.log.lines / self.elapsed) if self.elapsed else None,
            "left_out": self.left_out,
            "limits": [self._limit(s) for s in self.limits],
        }

    def _limit(self, s: LimitStats) -> dict[str, Any]:
        requests = s.requests
        top = sorted(s.rejected_keys.items(), key=lambda kv: (-kv[1], kv[0]))[: self.top]
        return {
            "name": s.name,
            "rate": "; ".join(r.code for r in s.rates) or "computed per request",
            "algorithm": s.algorithm,
            "requests": requests,
            "outcomes": dict(sorted(s.outcomes.items())),
            "would_reject": s.would_reject,
            "share": s.would_reject / requests if requests else 0.0,
            "keys": s.keys_seen,
            "keys_rejected": len(s.rejected_keys),
            "top_keys": [{"key": k, "rejections": n} for k, n in top],
            "timeline": [
                {"minute": m * 60, "requests": b[0], "would_reject": b[1]}
                for m, b in sorted(s.timeline.items())
            ],
            "rates": self.suggestions.get(s.name, []),
        }


def replay(target: Any, options: Options, mode: str, progress: IO[str] | None = None) -> Report:
    """Run every log through ``target`` (a ``ChecksTarget`` or ``ServiceTarget``)."""
    clock: ManualClock = target.clock
    if options.suggest:
        for stats in target.limits.values():
            stats.track_demand()
    reader = LogReader(options.fmt, options.time_field, options.aliases)
    started = time.perf_counter()
    first = last = None
    bar = _Progress(progress, options.logs) if progress is not None else None
    decide_run = getattr(target, "decide_run", None)
    stats = reader.stats
    shown = 0
    for path in options.logs:
        with open_log(path) as stream:
            if decide_run is not None:  # the fast path: one key field, runs of one time
                for batch in reader.runs(stream, target.field):
                    if batch:
                        if first is None:
                            first = batch[0][0]
                        last = batch[-1][0]
                    for t, keys in batch:
                        clock._now = t
                        decide_run(t, int(t * 1000 + 0.5), keys)
                    if bar is not None and stats.lines - shown >= PROGRESS_LINES:
                        shown = stats.lines
                        bar.show(stats)
                continue
            decide = target.decide
            for entry in reader.read(stream):
                t = entry.time
                if first is None:
                    first = t
                last = t
                clock._now = t  # ManualClock.set without its lock: one thread replays
                decide(entry, int(t * 1000 + 0.5))
                if bar is not None and stats.lines - shown >= PROGRESS_LINES:
                    shown = stats.lines
                    bar.show(stats)
    elapsed = time.perf_counter() - started
    if bar is not None:
        bar.done(reader.stats)
    report = Report(
        reader.stats, list(target.limits.values()), list(target.left_out), mode,
        options.share, elapsed, first, last, top=options.top,
    )  # fmt: skip
    if options.suggest:
        began = time.perf_counter()
        for stats in report.limits:
            report.suggestions[stats.name] = _suggestions(stats, options)
        report.suggest_seconds = time.perf_counter() - began
    for stats in report.limits:
        for d in stats.demand:
            d.close()
    return report


def _suggestions(stats: LimitStats, options: Options) -> list[dict[str, Any]]:
    out = []
    for rate, demand in zip(stats.rates, stats.demand, strict=True):
        per_algorithm = []
        peak: dict[str, float] = {}
        for algorithm in options.algorithms or (stats.algorithm,):
            needs = demand.needs(algorithm, stats.buckets)
            if algorithm == stats.algorithm or not peak:
                peak = quantiles(needs)
            s = suggest(needs, options.share, algorithm, rate.period)
            per_algorithm.append(
                {
                    "algorithm": s.algorithm,
                    "peak": _finite(quantiles(needs)),
                    "count": s.count,
                    "rate": s.rate,
                    "limited_keys": s.limited_keys,
                    "allowed_keys": s.allowed_keys,
                    "distribution": _histogram(needs),
                }
            )
        out.append(
            {
                "rate": rate.code,
                "keys": len(demand.ids),
                "peak": _finite(peak),
                "suggestions": per_algorithm,
            }
        )
    return out


def _finite(values: dict[str, float]) -> dict[str, int | None]:
    """Quantiles as JSON: whole counts, None past the largest count the algorithm takes."""
    return {k: (None if math.isinf(v) else int(v)) for k, v in values.items()}


def _histogram(needs: list[float]) -> list[list[float | None]]:
    """Keys per need, in powers-of-two bins: ``[[upper bound, keys], ...]`` (None: above
    the largest count the algorithm takes)."""
    bins: dict[int, int] = {}
    for n in needs:
        b = 0 if n <= 1 else math.ceil(math.log2(n)) if not math.isinf(n) else 64
        bins[b] = bins.get(b, 0) + 1
    return [[float(2**b) if b < 64 else None, c] for b, c in sorted(bins.items())]


class _Progress:
    """A one-line progress bar on stderr (by bytes read, when the logs are files)."""

    def __init__(self, out: IO[str], logs: Sequence[str]) -> None:
        import os

        self.out = out
        self.total = sum(os.path.getsize(p) for p in logs if p != "-" and os.path.isfile(p))
        self.gzip = any(p.endswith(".gz") for p in logs)
        self.started = time.perf_counter()

    def show(self, stats: LogStats, end: str = "\r") -> None:
        seconds = time.perf_counter() - self.started
        rate = stats.lines / seconds if seconds else 0.0
        text = f"{stats.lines:>12,} lines  {rate:>10,.0f} lines/s"
        if self.total and not self.gzip:
            done = min(1.0, stats.bytes_read / self.total)
            filled = int(done * 30)
            text = f"[{'#' * filled}{'.' * (30 - filled)}] {done:>4.0%} " + text
        self.out.write(text + end)
        self.out.flush()

    def done(self, stats: LogStats) -> None:
        self.show(stats, end="\n")


def progress_stream(wanted: bool | None) -> IO[str] | None:
    """stderr when asked, or by default when it is a terminal."""
    if wanted is None:
        wanted = sys.stderr.isatty()
    return sys.stderr if wanted else None


Render = Callable[[Report], str]
