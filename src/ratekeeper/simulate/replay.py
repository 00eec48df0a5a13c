"""``simulate``: read the logs, put their lines in time order, set the clock from each line,
let the target decide, report.

Every log is opened at once; each is read by its own ``LogReader`` (its own format and
counts) through a reorder buffer, and the files are merged by time (``order``). A line
later than the buffer's window stops that (``order.Late``): the logs are read again from
their start (``sources``: a file through the descriptor it was opened with, standard input
and pipes from the copy made as they were read), every line sorted (``sort``), and decided
on a fresh target, so the report covers every line whatever the disorder; ``--late skip``
leaves late lines out instead (asked for: a report on part of the logs), ``--late refuse``
refuses (``LogOrderError``). The clock is a ``ManualClock`` set to each line's time. A
target keyed on one field (``fast_field``: the candidates) is given lists of runs, the
lines of one time with that field of each (``LogReader.runs``), and sets the clock itself;
the others are given each line's ``Entry``. After the replay the suggestions are worked out
from each limit's demand (``suggest``, ``advice``). The report is plain data (``report``).
"""

from __future__ import annotations

import math
import sys
import time
from collections.abc import Iterator, Sequence
from contextlib import ExitStack
from dataclasses import dataclass, field
from datetime import UTC, datetime
from operator import itemgetter
from typing import IO, Any

from ..clock import ManualClock
from ..errors import ConfigError, LogOrderError
from .advice import advise
from .output.report import LogFile, Report, bucket_seconds
from .reading.lines import MAX_LINE
from .reading.logs import Entry, LogReader, LogStats, Run
from .reading.order import (
    DEFAULT_WINDOW,
    HELD_ENTRIES,
    HELD_RUN_LINES,
    Late,
    Room,
    Skew,
    SortedEntry,
    merged_entries,
    merged_runs,
    ordered_entries,
    ordered_runs,
    run_lines,
    sorted_entries,
    sorted_runs,
)
from .reading.sort import ExternalSort
from .reading.sources import Source
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
    late: str = "sort"
    """A line further behind than ``window``: ``sort`` every line (the logs are read again),
    ``skip`` it (counted, not decided: a report on part of the logs), or ``refuse``."""
    reject_share: float | None = None
    """Also suggest the smallest count rejecting at most this share of the requests."""


def replay(target: Any, options: Options, mode: str, progress: IO[str] | None = None) -> Report:
    """Run every log through ``target`` (a ``ChecksTarget``, ``ServiceTarget`` or
    ``CandidatesTarget``): streaming, and when a line comes later than ``options.window``
    (and ``options.late`` is ``sort``) once more from the start, every line sorted, on a
    ``target.fresh()``. ``LogOrderError`` when that cannot be done (``late="refuse"``, or
    no room for the sort)."""
    if options.late not in LATE:
        raise ConfigError(f"--late {options.late!r} is invalid; expected one of {', '.join(LATE)}")
    if list(options.logs).count("-") > 1:
        raise ConfigError("- (standard input) is given more than once; give it once")
    started = time.perf_counter()
    with ExitStack() as stack:
        sources = [Source(path, copy=options.late == "sort") for path in options.logs]
        for source in sources:
            stack.callback(source.close)
        try:
            done = _decide(target, options, sources, progress, late=None)
        except Late as late:
            if options.late == "refuse":
                fast = getattr(target, "fast_field", None) is not None
                held = HELD_RUN_LINES if fast else HELD_ENTRIES
                raise LogOrderError(_refused(late, options.window, held)) from None
            _drop_demand(target)
            target = target.fresh()
            try:
                done = _decide(target, options, sources, progress, late=late)
            except LogOrderError as exc:
                raise LogOrderError(
                    f"{late.skew.name} is further out of time order than --skew "
                    f"({options.window:,.0f} s) and {exc}: nothing is reported. "
                    f"{_fixes(late, options.window)}, or set TMPDIR to a directory with room."
                ) from None
    files, first, last, written = done
    elapsed = time.perf_counter() - started  # both readings when it sorted
    report = Report(
        files, list(target.limits.values()), list(target.left_out), mode, options.share,
        elapsed, first, last, options.window, top=options.top, late=options.late,
        sorted_bytes=written, reject_share=options.reject_share,
    )  # fmt: skip
    try:
        if options.suggest:
            began = time.perf_counter()
            for stats in report.limits:
                report.suggestions[stats.name] = _suggestions(stats, options)
                report.timelines[stats.name] = _timelines(report, stats)
            report.suggest_seconds = time.perf_counter() - began
    finally:
        _drop_demand(target)
    return report


LATE = ("sort", "skip", "refuse")
"""What a line later than the skew window makes the replay do (``--late``)."""


def _decide(
    target: Any,
    options: Options,
    sources: list[Source],
    progress: IO[str] | None,
    late: Late | None,
) -> tuple[list[LogFile], float | None, float | None, int | None]:
    """Read every log and let ``target`` decide each line in time order: through the
    reorder buffers (``late`` None) or, after ``late``, every line sorted. (files, first
    time, last time, bytes the sort wrote or None when it did not sort)."""
    clock: ManualClock = target.clock
    if options.suggest:
        for stats in target.limits.values():
            stats.track_demand()
    name = getattr(target, "fast_field", None)
    files: list[LogFile] = []
    first = last = None
    written = None
    sorter: ExternalSort[Any] | None = None
    with ExitStack() as stack:
        runs: list[Iterator[list[Run]]] = []
        entries: list[Iterator[Entry]] = []
        for source in sources:
            stream = stack.enter_context(source.open() if late is None else source.again())
            reader = LogReader(options.fmt, options.time_field, options.aliases, options.max_line)
            f = LogFile(source.path, reader, Skew(name=source.name, skip=options.late == "skip"))
            files.append(f)
            if name is not None:
                runs.append(reader.runs(stream, name))
            else:
                entries.append(reader.read(stream))
        bar = _Progress(progress, options.logs, files) if progress is not None else None
        tick = bar.tick if bar is not None else _nothing
        skews = [f.skew for f in files]
        if name is not None:
            if late is None:
                room = Room(HELD_RUN_LINES)  # the files' buffers share it
                batches = merged_runs(
                    [
                        ordered_runs(r, options.window, s, room)
                        for r, s in zip(runs, skews, strict=True)
                    ]
                )
            else:
                by_time: ExternalSort[Run] = ExternalSort(
                    itemgetter(0), HELD_RUN_LINES, lines=run_lines
                )
                sorter = stack.enter_context(by_time)
                batches = sorted_runs(zip(runs, skews, strict=True), options.window, by_time, tick)
            decide_runs = target.decide_runs
            for batch in batches:
                if first is None:
                    first = batch[0][0]
                last = batch[-1][0]
                decide_runs(batch)  # sets the clock itself
                tick()
        else:
            if late is None:
                shared = Room(HELD_ENTRIES)
                ordered: Iterator[Entry] = merged_entries(
                    [
                        ordered_entries(e, options.window, s, room=shared)
                        for e, s in zip(entries, skews, strict=True)
                    ]
                )
            else:
                by_key: ExternalSort[SortedEntry] = ExternalSort(itemgetter(0, 1), HELD_ENTRIES)
                sorter = stack.enter_context(by_key)
                ordered = sorted_entries(
                    zip(entries, skews, strict=True), options.window, by_key, tick
                )
            decide = target.decide
            entry: Entry
            for i, entry in enumerate(ordered):
                t = entry.time
                if first is None:
                    first = t
                last = t
                clock._now = t
                decide(entry, int(t * 1000 + 0.5))
                if not i % 4096:
                    tick()
        if sorter is not None:
            written = sorter.written
    if bar is not None:
        bar.done()
    return files, first, last, written


def _nothing() -> None:
    pass


def _drop_demand(target: Any) -> None:
    """Close the temporary files of the limits' demand."""
    for stats in target.limits.values():
        for d in stats.demand:
            d.close()


def _refused(late: Late, window: float, held: int) -> str:
    """Why ``--late refuse`` refused, and what to do."""
    if late.behind > window:
        why = (
            f"is {late.behind:,.0f} s behind the newest line before it, further than --skew "
            f"({window:,.0f} s)"
        )
    else:  # the buffers were full: lines went before their time
        why = (
            "came after newer lines were decided: the reorder buffers were full (they hold "
            f"about {held:,} lines)"
        )
    return (
        f"{late.skew.name}: a line at {_utc(late.time)} {why}, and --late refuse was given: "
        f"nothing is reported. {_fixes(late, window)}, or leave out --late refuse (every "
        "line is then sorted)."
    )


def _fixes(late: Late, window: float) -> str:
    """What puts a log in order before simulate reads it, or lets it stream."""
    out = (
        "Sort the lines by time first, or give rotated logs as separate files (in any order) "
        "rather than one stream"
    )
    if late.behind > window:
        minutes = max(1, math.ceil(late.behind / 60))
        out += f", or give --skew {minutes}m or more (more if other lines are further behind)"
    return out


def _utc(t: float) -> str:
    return datetime.fromtimestamp(t, UTC).strftime("%Y-%m-%d %H:%M:%S UTC")


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
                demand, needs, algorithm, rate.period, options.share, stats.buckets, requests,
                options.reject_share,
            )  # fmt: skip
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
