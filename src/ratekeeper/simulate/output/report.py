"""The ``Report`` of a replay, as plain data (``Report.to_json``, what ``--json`` writes).

The terminal summary (``render``) and the HTML page (``html``) are drawn from this data and
nothing else, so the three carry the same facts. Per log file: its format and how it was
detected, its lines, and how far it was from time order. Per limit: requests, would-be
rejections and their share, keys and the share of them rejected, the top keys (requests,
their share of the limit's traffic, rejections, first and last rejection, the window that
rejected them, a timeline), requests and rejections per minute, and per rate the per-key
peak usage and the suggestions (``advice``).
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from ..reading.logs import LogReader, LogStats
from ..reading.order import Skew
from ..reading.times import zone_name
from ..stats import LimitStats

TIMELINE_BUCKETS = 120
"""A top key's timeline has at most about this many buckets."""
BUCKETS = (60, 300, 900, 3600, 3 * 3600, 6 * 3600, 86400, 7 * 86400)
"""Bucket lengths (seconds) a timeline is drawn in: the shortest that keeps it short."""


def bucket_seconds(first: float | None, last: float | None, most: int = TIMELINE_BUCKETS) -> int:
    """The shortest of ``BUCKETS`` giving at most ``most`` buckets from ``first`` to ``last``."""
    span = (last or 0.0) - (first or 0.0)
    return next((b for b in BUCKETS if span / b <= most), BUCKETS[-1])


@dataclass(slots=True)
class LogFile:
    """One log file of the replay: its reader (format, counts) and its order (skew)."""

    path: str
    reader: LogReader
    skew: Skew = field(default_factory=Skew)

    def to_json(self) -> dict[str, Any]:
        stats, detected, skew = self.reader.stats, self.reader.detected, self.skew
        return {
            "path": self.path,
            "format": None if detected is None else detected.name,
            "detected": None if detected is None else str(detected),
            "lines": stats.lines,
            "parsed": stats.parsed,
            "unparsable": stats.unparsable,
            "other": stats.other,
            "backward_steps": skew.backward,
            "largest_lag_seconds": round(skew.largest, 3),
            "beyond_window": skew.beyond,
            "late": skew.late,
            "fields": self.reader.field_names,
        }


@dataclass(slots=True)
class Report:
    """Everything ``simulate`` found."""

    files: list[LogFile]
    limits: list[LimitStats]
    left_out: list[str]
    mode: str
    share: float
    elapsed: float
    first: float | None
    last: float | None
    window: float = 0.0
    late: str = "sort"
    """What a line further behind than ``window`` made the replay do (``--late``)."""
    sorted_bytes: int | None = None
    """None: the lines streamed through the reorder buffers; else every line was sorted,
    writing this many bytes of temporary files (0: in memory)."""
    reject_share: float | None = None
    """The share of requests the third suggestion rejects at most (None: not asked)."""
    suggestions: dict[str, list[dict[str, Any]]] = field(default_factory=dict)
    timelines: dict[str, dict[str, Counter[int]]] = field(default_factory=dict)
    """Per limit, requests per timeline bucket of each top key (when demand was kept)."""
    top: int = 10
    suggest_seconds: float = 0.0

    @property
    def log(self) -> LogStats:
        """The counts of every file, added (samples: the first few of any file)."""
        total = LogStats()
        for f in self.files:
            s = f.reader.stats
            total.lines += s.lines
            total.parsed += s.parsed
            total.unparsable += s.unparsable
            total.bytes_read += s.bytes_read
            total.samples.extend(s.samples[: 5 - len(total.samples)])
        return total

    @property
    def skew(self) -> Skew:
        total = Skew()
        for f in self.files:
            total.add(f.skew)
        return total

    @property
    def zone(self) -> int:
        """The UTC offset (seconds) the logs were written in, most common first."""
        zones: Counter[int] = Counter()
        for f in self.files:
            zones.update(f.reader.time.zones)
        return zones.most_common(1)[0][0] if zones else 0

    def to_json(self) -> dict[str, Any]:
        """The report as JSON-ready data (what ``--json`` prints)."""
        log, skew = self.log, self.skew
        samples = []
        for f in self.files:
            for n, text, why in f.reader.stats.samples:
                samples.append({"file": f.path, "line": n, "text": text, "why": why})
        return {
            "lines": log.lines,
            "parsed": log.parsed,
            "unparsable": log.unparsable,
            "other": log.other,
            "late": skew.late,
            "decided": log.parsed - skew.late,
            "unparsable_samples": samples[:5],
            "files": [f.to_json() for f in self.files],
            "order": {
                "window_seconds": self.window,
                "late_policy": self.late,
                "sorted": self.sorted_bytes is not None,
                "sort_temporary_bytes": self.sorted_bytes,
                "backward_steps": skew.backward,
                "largest_lag_seconds": round(skew.largest, 3),
                "beyond_window": skew.beyond,
                "late": skew.late,
                "late_samples": [
                    {"time": t, "behind_seconds": round(lag, 3), "what": what}
                    for t, lag, what in skew.late_samples
                ],
            },
            "first": self.first,
            "last": self.last,
            "zone": zone_name(self.zone),
            "zone_offset_seconds": self.zone,
            "mode": self.mode,
            "share": self.share,
            "reject_share": self.reject_share,
            "seconds": round(self.elapsed, 3),
            "suggest_seconds": round(self.suggest_seconds, 3),
            "lines_per_second": round(log.lines / self.elapsed) if self.elapsed else None,
            "left_out": self.left_out,
            "limits": [self._limit(s) for s in self.limits],
        }

    def top_keys(self, s: LimitStats) -> list[str]:
        """The keys with most rejections (then by name), at most ``top``."""
        ranked = sorted(s.rejected.items(), key=lambda kv: (-kv[1].count, kv[0]))
        return [k for k, _ in ranked[: self.top]]

    def _limit(self, s: LimitStats) -> dict[str, Any]:
        requests = s.requests
        keys = s.keys_seen
        bucket = bucket_seconds(self.first, self.last)
        timelines = self.timelines.get(s.name, {})
        top = []
        for key in self.top_keys(s):
            record = s.rejected[key]
            asked = s.requests_of(key)
            rejections: Counter[int] = Counter()
            for minute, n in record.minutes.items():
                rejections[minute * 60 // bucket] += n
            top.append(
                {
                    "key": key,
                    "requests": asked,
                    "traffic_share": asked / requests if requests else 0.0,
                    "rejections": record.count,
                    "rejected_share": record.count / asked if asked else 0.0,
                    "first_rejected": record.first,
                    "last_rejected": record.last,
                    "windows": dict(record.windows.most_common()),
                    "timeline": {
                        "bucket_seconds": bucket,
                        "requests": _series(timelines.get(key), bucket),
                        "rejections": _series(rejections, bucket),
                    },
                }
            )
        return {
            "name": s.name,
            "rate": "; ".join(r.code for r in s.rates) or "computed per request",
            "algorithm": s.algorithm,
            "key": s.key,
            "requests": requests,
            "outcomes": dict(sorted(s.outcomes.items())),
            "would_reject": s.would_reject,
            "share": s.would_reject / requests if requests else 0.0,
            "keys": keys,
            "keys_rejected": len(s.rejected),
            "keys_rejected_share": len(s.rejected) / keys if keys else 0.0,
            "key_missing": s.key_missing,
            "top_keys": top,
            "timeline": [
                {"minute": m * 60, "requests": b[0], "would_reject": b[1]}
                for m, b in sorted(s.timeline.items())
            ],
            "rates": self.suggestions.get(s.name, []),
        }


def _series(counts: Counter[int] | None, bucket: int) -> list[list[int]]:
    """``[[bucket start (epoch s), count], ...]`` in time order; empty without counts."""
    if not counts:
        return []
    return [[b * bucket, n] for b, n in sorted(counts.items())]


def trouble(data: dict[str, Any]) -> str | None:
    """Why a report cannot be trusted, or None: no request parsed, most lines unparsable, or
    a limit's key field missing on most of the requests it saw."""
    files = ", ".join(f["path"] for f in data["files"]) or "the input"
    detected = "; ".join(f"{f['path']}: {f['detected']}" for f in data["files"] if f["detected"])
    first = data["unparsable_samples"][:1]
    example = f" First bad line ({first[0]['line']}): {first[0]['why']}." if first else ""
    hint = " Name the format with --format, the time with --time-field, fields with --field."
    if not data["parsed"]:
        return (
            f"no request parsed from {files} ({data['lines']:,} lines, "
            f"{data['unparsable']:,} unparsable; detected format: {detected or 'none'})."
            + example
            + hint
        )
    if data["unparsable"] * 2 > data["unparsable"] + data["parsed"]:
        return (
            f"most lines are unparsable ({data['unparsable']:,} of "
            f"{data['unparsable'] + data['parsed']:,}; detected format: {detected})."
            + example
            + hint
        )
    for limit in data["limits"]:
        missing, seen = limit["key_missing"], limit["key_missing"] + limit["requests"]
        if missing * 2 > seen:
            names = sorted({n for f in data["files"] for n in f.get("fields", [])})
            return (
                f"{limit['name']}: its key field {limit['key']!r} is missing on "
                f"{missing:,} of {seen:,} requests; fields in the log: "
                f"{', '.join(names) or 'none'}. Key it with --limit NAME=RATE,key=FIELD "
                "(or --key-field, --key POLICY=FIELD), or map a field with --field."
            )
    return None
