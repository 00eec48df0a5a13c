"""``simulate``: read the logs, put their lines in time order, set the clock from each line,
let the target decide, report.

Every log is opened at once; each is read by its own ``LogReader`` (its own format and
counts) through a reorder buffer, and the files are merged by time (``order``). The clock is
a ``ManualClock`` set to each line's time. A target keyed on one field (``fast_field``: the
candidates) is given lists of runs, the lines of one time with that field of each
(``LogReader.runs``), and sets the clock itself; the others are given each line's
``Entry``. After the replay the suggestions are worked out
from each limit's demand (``suggest``, ``advice``). The report is plain data (``report``).
"""

from __future__ import annotations

import math
import sys
import time
from collections.abc import Iterator, Sequence
from contextlib import ExitStack
from dataclasses import dataclass, field
from typing import IO, Any

from ..clock import ManualClock
from .advice import advise
from .output.report import LogFile, Report, bucket_seconds
from .reading.lines import MAX_LINE, open_log
from .reading.logs import Entry, LogReader, LogStats, Run
from .reading.order import (
    DEFAULT_WINDOW,
    Keyed,
    merged_entries,
    merged_runs,
    ordered_entries,
    ordered_runs,
)
from .stats import LimitStats
from .suggest import quantiles

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
    window: float = DEFAULT_WINDOW
    """Seconds a line may lag the newest line of its file before it (``order``)."""
    max_line: int = MAX_LINE


def replay(target: Any, options: Options, mode: str, progress: IO[str] | None = None) -> Report:
    """Run every log through ``target`` (a ``ChecksTarget``, ``ServiceTarget`` or
    ``CandidatesTarget``)."""
    clock: ManualClock = target.clock
    if options.suggest:
        for stats in target.limits.values():
            stats.track_demand()
    name = getattr(target, "fast_field", None)
    files: list[LogFile] = []
    started = time.perf_counter()
    first = last = None
    with ExitStack() as stack:
        runs: list[Iterator[list[Run]]] = []
        entries: list[Iterator[Keyed]] = []
        for path in options.logs:
            stream = stack.enter_context(open_log(path))
            reader = LogReader(options.fmt, options.time_field, options.aliases, options.max_line)
            f = LogFile(path, reader)
            files.append(f)
            if name is not None:
                runs.append(ordered_runs(reader.runs(stream, name), options.window, f.skew))
            else:
                entries.append(ordered_entries(reader.read(stream), options.window, f.skew))
        bar = _Progress(progress, options.logs, files) if progress is not None else None
        if name is not None:
            decide_runs = target.decide_runs
            for batch in merged_runs(runs):
                if first is None:
                    first = batch[0][0]
                last = batch[-1][0]
                decide_runs(batch)  # sets the clock itself
                if bar is not None:
                    bar.tick()
        else:
            decide = target.decide
            entry: Entry
            for i, entry in enumerate(merged_entries(entries)):
                t = entry.time
                if first is None:
                    first = t
                last = t
                clock._now = t
                decide(entry, int(t * 1000 + 0.5))
                if bar is not None and not i % 4096:
                    bar.tick()
    elapsed = time.perf_counter() - started
    if bar is not None:
        bar.done()
    report = Report(
        files, list(target.limits.values()), list(target.left_out), mode, options.share,
        elapsed, first, last, options.window, top=options.top,
    )  # fmt: skip
    try:
        if options.suggest:
            began = time.perf_counter()
            for stats in report.limits:
                report.suggestions[stats.name] = _suggestions(stats, options)
                report.timelines[stats.name] = _timelines(report, stats)
            report.suggest_seconds = time.perf_counter() - began
    finally:
        for stats in report.limits:
            for d in stats.demand:
                d.close()
    return report


def _suggestions(stats: LimitStats, options: Options) -> list[dict[str, Any]]:
    out = []
    requests = stats.requests
    for rate, demand in zip(stats.rates, stats.demand, strict=True):
        per_algorithm = []
        peak: dict[str, float] = {}
        for algorithm in options.algorithms or (stats.algorithm,):
            needs = demand.needs(algorithm, stats.buckets)
            if algorithm == stats.algorithm or not peak:
                peak = quantiles(needs)
            advice = advise(
                demand, needs, algorithm, rate.period, options.share, stats.buckets, requests
            )
            advice["peak"] = _finite(quantiles(needs))
            advice["distribution"] = _histogram(needs)
            advice["candidate"] = {
                "count": rate.count,
                "limited_keys": sum(1 for n in needs if n > rate.count),
            }
            per_algorithm.append(advice)
        out.append(
            {
                "rate": rate.code,
                "keys": len(demand.ids),
                "peak": _finite(peak),
                "suggestions": per_algorithm,
            }
        )
    return out


def _timelines(report: Report, stats: LimitStats) -> dict[str, Any]:
    """Requests per timeline bucket of the limit's top keys (from its first rate's demand)."""
    if not stats.demand:
        return {}
    demand = stats.demand[0]
    kids = {demand.ids[k]: k for k in report.top_keys(stats) if k in demand.ids}
    bucket = bucket_seconds(report.first, report.last)
    counts = demand.timelines(kids, bucket * 1000)
    return {kids[k]: c for k, c in counts.items()}


def _finite(values: dict[str, float]) -> dict[str, int | None]:
    """Quantiles as JSON: whole counts, None past the largest count the algorithm takes."""
    return {k: (None if math.isinf(v) else int(v)) for k, v in values.items()}


def _histogram(needs: list[float]) -> list[list[float | None]]:
    """Keys per need, in powers-of-two bins, every bin from 1 to the largest need's
    (empty ones too: the chart's scale stays even): ``[[upper bound, keys], ...]`` (None:
    above the largest count the algorithm takes)."""
    bins: dict[int, int] = {}
    for n in needs:
        b = 0 if n <= 1 else math.ceil(math.log2(n)) if not math.isinf(n) else 64
        bins[b] = bins.get(b, 0) + 1
    if not bins:
        return []
    finite = [b for b in bins if b < 64]
    top = max(finite) if finite else 0
    out: list[list[float | None]] = [[float(2**b), bins.get(b, 0)] for b in range(top + 1)]
    if 64 in bins:
        out.append([None, bins[64]])
    return out


class _Progress:
    """A one-line progress bar on stderr (by characters read, when the logs are files)."""

    def __init__(self, out: IO[str], logs: Sequence[str], files: list[LogFile]) -> None:
        import os

        self.out = out
        self.files = files
        self.total = sum(os.path.getsize(p) for p in logs if p != "-" and os.path.isfile(p))
        self.gzip = any(p.endswith(".gz") for p in logs)
        self.started = time.perf_counter()
        self.shown = 0

    def _stats(self) -> LogStats:
        total = LogStats()
        for f in self.files:
            total.lines += f.reader.stats.lines
            total.bytes_read += f.reader.stats.bytes_read
        return total

    def tick(self) -> None:
        stats = self._stats()
        if stats.lines - self.shown >= PROGRESS_LINES:
            self.shown = stats.lines
            self.show(stats)

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

    def done(self) -> None:
        self.show(self._stats(), end="\n")


def progress_stream(wanted: bool | None) -> IO[str] | None:
    """stderr when asked, or by default when it is a terminal."""
    if wanted is None:
        wanted = sys.stderr.isatty()
    return sys.stderr if wanted else None
