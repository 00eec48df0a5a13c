"""SVG charts for the HTML report, drawn from the report's data: no script, no network.

- ``timeline``: requests and would-be rejections per bucket on a real time axis (the axis
  runs from the first line to the last, in the log's time zone, dates where days change;
  stretches without a line are shaded and labelled), with axis titles, a y scale with grid
  lines and a legend;
- ``sparkline``: one key's requests and rejections on the same time axis, for the top keys;
- ``histogram``: keys per peak usage, in power-of-two bins (every bin drawn, so the x scale
  is even) on a log y scale, with the candidate's count and the suggested counts marked and
  named in the legend.
"""

from __future__ import annotations

import html
import math
from collections.abc import Sequence
from itertools import pairwise
from typing import Any

from .render import when

W, H = 760, 230
LEFT, RIGHT, TOP, BOTTOM = 64, 16, 28, 52
STEPS = (60, 300, 900, 1800, 3600, 3 * 3600, 6 * 3600, 12 * 3600, 86400, 2 * 86400, 7 * 86400)
"""Time-axis tick steps (seconds): the shortest that gives at most ``TICKS`` ticks."""
TICKS = 8
COLORS = {"requests": "#7aa6d8", "rejected": "#d9534f", "gap": "#eceff3"}
MARKS = {"candidate": "#1d2733", "nobody": "#2e7d32", "outliers": "#e07b00", "requests": "#7b3fa0"}


def esc(x: Any) -> str:
    return html.escape(str(x), quote=True)


def nice_ticks(top: float, count: int = 4) -> list[float]:
    """0 and round values up to at least ``top`` (1, 2 or 5 times a power of ten apart)."""
    if top <= 0:
        return [0.0, 1.0]
    raw = top / count
    power = 10 ** math.floor(math.log10(raw))
    step = next(m * power for m in (1, 2, 5, 10) if m * power >= raw)
    return [i * step for i in range(math.ceil(top / step - 1e-9) + 1)]


def time_ticks(t0: float, t1: float, offset: int) -> tuple[list[float], str]:
    """Tick times (aligned in the log's zone) between ``t0`` and ``t1``, and their format."""
    span = max(t1 - t0, 60.0)
    step = next((s for s in STEPS if span / s <= TICKS), STEPS[-1])
    first = float(math.ceil((t0 + offset) / step) * step - offset)
    ticks = [first + i * step for i in range(int((t1 - first) // step) + 1)]
    if step >= 86400:
        fmt = "%b %d"
    elif span > 86400 or when(t0, offset, "%d") != when(t1, offset, "%d"):
        fmt = "%b %d %H:%M"
    else:
        fmt = "%H:%M"
    return ticks, fmt


class Frame:
    """The plotting area of one chart: value -> pixel on both axes."""

    def __init__(self, x0: float, x1: float, y_top: float, log_y: bool = False) -> None:
        self.x0, self.x1 = x0, max(x1, x0 + 1e-9)
        self.y_top = y_top
        self.log_y = log_y

    def x(self, value: float) -> float:
        return LEFT + (W - LEFT - RIGHT) * (value - self.x0) / (self.x1 - self.x0)

    def y(self, value: float) -> float:
        if self.log_y:
            frac = math.log10(1 + value) / math.log10(1 + self.y_top)
        else:
            frac = value / self.y_top if self.y_top else 0.0
        return H - BOTTOM - (H - TOP - BOTTOM) * frac


def _svg(label: str, parts: list[str], width: int = W, height: int = H, kind: str = "") -> str:
    return (
        f'<svg class="chart {kind}" width="{width}" height="{height}" '
        f'viewBox="0 0 {width} {height}" role="img" aria-label="{esc(label)}">'
        f"{''.join(parts)}</svg>"
    )


def _y_axis(frame: Frame, ticks: Sequence[float], title: str) -> list[str]:
    parts = []
    for v in ticks:
        y = frame.y(v)
        parts.append(f'<line class=grid x1="{LEFT}" y1="{y:.1f}" x2="{W - RIGHT}" y2="{y:.1f}"/>')
        parts.append(
            f'<text class=tick x="{LEFT - 6}" y="{y + 4:.1f}" text-anchor=end>{_short(v)}</text>'
        )
    middle = (TOP + H - BOTTOM) / 2
    parts.append(
        f'<text class=axis-title transform="translate(14 {middle:.0f}) rotate(-90)" '
        f"text-anchor=middle>{esc(title)}</text>"
    )
    parts.append(f'<line class=axis x1="{LEFT}" y1="{TOP}" x2="{LEFT}" y2="{H - BOTTOM}"/>')
    return parts


def _short(v: float) -> str:
    if v >= 1e6:
        return f"{v / 1e6:g}M"
    if v >= 1e3:
        return f"{v / 1e3:g}k"
    return f"{v:g}"


LEGEND_ROW = 18
"""Pixels between the rows of a legend that does not fit on one."""


def _legend(items: Sequence[tuple[str, str, str]], x: float = LEFT) -> tuple[list[str], int]:
    """(class or colour, label, kind: box or line) in rows above the plot, a new row when
    one would run past the chart's width; and how many rows."""
    parts = []
    left, y = x, 0
    for color, label, kind in items:
        width = 30 + 7 * len(label)
        if x > left and x + width > W - RIGHT:
            x, y = left, y + LEGEND_ROW
        if kind == "box":
            parts.append(f'<rect x="{x:.0f}" y="{8 + y}" width="12" height="10" fill="{color}"/>')
        else:
            parts.append(
                f'<line x1="{x:.0f}" y1="{13 + y}" x2="{x + 14:.0f}" y2="{13 + y}" '
                f'stroke="{color}" stroke-width="2" stroke-dasharray="4 3"/>'
            )
        parts.append(f'<text class=legend x="{x + 18:.0f}" y="{17 + y}">{esc(label)}</text>')
        x += width
    return parts, 1 + y // LEGEND_ROW


def _below_legend(parts: list[str], rows: int) -> tuple[list[str], int]:
    """The plot moved down for a legend of ``rows`` rows, and the chart's height."""
    shift = LEGEND_ROW * (rows - 1)
    if not shift:
        return parts, H
    return [f'<g transform="translate(0 {shift})">', *parts, "</g>"], H + shift


def timeline(
    points: Sequence[tuple[float, int, int]],
    t0: float,
    t1: float,
    bucket: int,
    offset: int,
    zone: str,
) -> str:
    """Requests and rejections per ``bucket`` seconds: ``points`` are (bucket start,
    requests, rejections) for the buckets with traffic."""
    if not points:
        return "<p class=muted>no requests</p>"
    start = math.floor(t0 / bucket) * bucket
    end = math.floor(t1 / bucket) * bucket + bucket
    top = max(p[1] for p in points) or 1
    yticks = nice_ticks(top)
    frame = Frame(start, end, yticks[-1])
    parts = _y_axis(frame, yticks, f"requests per {_duration(bucket)}")
    parts += _gaps(points, start, end, bucket, frame)
    width = max(frame.x(start + bucket) - frame.x(start) - 0.5, 0.8)
    for b, requests, rejected in points:
        x = frame.x(b)
        label = f"{when(b, offset)} ({zone}): {requests:,} requests, {rejected:,} would be rejected"
        parts.append(
            f"<g><title>{esc(label)}</title>"
            f'<rect fill="{COLORS["requests"]}" x="{x:.1f}" y="{frame.y(requests):.1f}" '
            f'width="{width:.1f}" height="{frame.y(0) - frame.y(requests):.1f}"/>'
            f'<rect fill="{COLORS["rejected"]}" x="{x:.1f}" y="{frame.y(rejected):.1f}" '
            f'width="{width:.1f}" height="{frame.y(0) - frame.y(rejected):.1f}"/></g>'
        )
    parts += _time_axis(frame, t0, t1, offset, zone)
    legend, rows = _legend(
        [(COLORS["requests"], "requests", "box"), (COLORS["rejected"], "would be rejected", "box"),
         (COLORS["gap"], "no lines in the log", "box")]
    )  # fmt: skip
    parts, height = _below_legend(parts, rows)
    return _svg(
        "requests and would-be rejections over time", legend + parts, height=height,
        kind="timeline",
    )  # fmt: skip


def _gaps(
    points: Sequence[tuple[float, int, int]], start: float, end: float, bucket: int, f: Frame
) -> list[str]:
    """Shaded stretches of at least two buckets without a line."""
    parts = []
    edges = [start - bucket, *(p[0] for p in points), end]
    for a, b in pairwise(edges):
        if b - a > 2 * bucket:
            x0, x1 = f.x(a + bucket), f.x(b)
            parts.append(
                f'<rect class=gap fill="{COLORS["gap"]}" x="{x0:.1f}" y="{TOP}" '
                f'width="{x1 - x0:.1f}" height="{H - TOP - BOTTOM}"><title>no lines from '
                f"{esc(_duration(int(b - a - bucket)))}</title></rect>"
            )
    return parts


def _time_axis(frame: Frame, t0: float, t1: float, offset: int, zone: str) -> list[str]:
    ticks, fmt = time_ticks(frame.x0, frame.x1, offset)
    base = H - BOTTOM
    parts = [f'<line class=axis x1="{LEFT}" y1="{base}" x2="{W - RIGHT}" y2="{base}"/>']
    for t in ticks:
        x = frame.x(t)
        parts.append(f'<line class=axis x1="{x:.1f}" y1="{base}" x2="{x:.1f}" y2="{base + 4}"/>')
        parts.append(
            f'<text class=tick x="{x:.1f}" y="{base + 16}" text-anchor=middle>'
            f"{esc(when(t, offset, fmt))}</text>"
        )
    parts.append(
        f'<text class=axis-title x="{(LEFT + W - RIGHT) / 2:.0f}" y="{H - 8}" text-anchor=middle>'
        f"time ({esc(zone)}), {esc(when(t0, offset, '%Y-%m-%d %H:%M'))} to "
        f"{esc(when(t1, offset, '%Y-%m-%d %H:%M'))}</text>"
    )
    return parts


def _duration(seconds: int) -> str:
    for unit, name in ((86400, "day"), (3600, "hour"), (60, "minute")):
        if seconds >= unit and seconds % unit == 0:
            n = seconds // unit
            return name if n == 1 else f"{n} {name}s"
    return f"{seconds} s"


def sparkline(
    requests: Sequence[Sequence[float]],
    rejections: Sequence[Sequence[float]],
    t0: float,
    t1: float,
    bucket: int,
) -> str:
    """One key's requests (blue) and rejections (red) per bucket, on the report's axis."""
    width, height = 220, 34
    start = math.floor(t0 / bucket) * bucket
    end = math.floor(t1 / bucket) * bucket + bucket
    top = max([n for _, n in requests] + [n for _, n in rejections] + [1])
    scale = (width - 2) / max(end - start, 1)
    bar = max(bucket * scale, 1.0)
    parts = [f'<line class=axis x1="0" y1="{height - 1}" x2="{width}" y2="{height - 1}"/>']
    for series, color in ((requests, COLORS["requests"]), (rejections, COLORS["rejected"])):
        for b, n in series:
            h = (height - 4) * n / top
            parts.append(
                f'<rect fill="{color}" x="{1 + (b - start) * scale:.1f}" '
                f'y="{height - 1 - h:.1f}" width="{bar:.1f}" height="{h:.1f}"/>'
            )
    return _svg("this key's requests and rejections over time", parts, width, height, "spark")


def histogram(
    bins: Sequence[Sequence[Any]], marks: Sequence[tuple[str, int | None, str]], window: str
) -> str:
    """Keys per peak-usage bin (``[upper bound or None, keys]``, bounds powers of two), on a
    log y scale, with ``marks``: (kind, count, label) drawn as vertical lines."""
    if not bins:
        return "<p class=muted>no keys</p>"
    bins = _through(bins, max((c for _, c, _ in marks if c is not None), default=1))
    n = len(bins)
    top = max(int(c) for _, c in bins) or 1
    frame = Frame(0, n, 10 ** math.ceil(math.log10(top + 1)), log_y=True)
    yticks = [10**i for i in range(int(math.log10(frame.y_top)) + 1)]
    parts = _y_axis(frame, [0, *yticks], "keys (log scale)")
    bw = frame.x(1) - frame.x(0)
    every = max(1, math.ceil(n * 34 / (W - LEFT - RIGHT)))  # labels ~34 px apart at least
    for i, (bound, count) in enumerate(bins):
        x = frame.x(i)
        name = "more" if bound is None else f"≤{int(bound):,}"
        low = 0 if bound is None or bound <= 1 else int(bound) // 2 + 1
        what = f"{int(count):,} keys peaked at {name}" + (f" (from {low:,})" if low else "")
        parts.append(
            f'<g class=bin><title>{esc(what)}</title><rect fill="{COLORS["requests"]}" '
            f'x="{x + 1:.1f}" y="{frame.y(count):.1f}" width="{max(bw - 2, 1):.1f}" '
            f'height="{frame.y(0) - frame.y(count):.1f}"/></g>'
        )
        if i % every == 0:
            parts.append(
                f'<text class=tick x="{x + bw / 2:.1f}" y="{H - BOTTOM + 16}" '
                f"text-anchor=middle>{esc(name)}</text>"
            )
    base = H - BOTTOM
    parts.append(f'<line class=axis x1="{LEFT}" y1="{base}" x2="{W - RIGHT}" y2="{base}"/>')
    legend = [(COLORS["requests"], "keys", "box")]
    for kind, count, label in marks:
        if count is None:
            continue
        mx = _mark_x(bins, count, frame)
        if mx is None:
            continue
        color = MARKS[kind]
        parts.append(
            f'<line class="mark {kind}" x1="{mx:.1f}" y1="{TOP}" x2="{mx:.1f}" y2="{base}" '
            f'stroke="{color}" stroke-width="2" stroke-dasharray="4 3">'
            f"<title>{esc(label)}</title></line>"
        )
        legend.append((color, label, "line"))
    parts.append(
        f'<text class=axis-title x="{(LEFT + W - RIGHT) / 2:.0f}" y="{H - 8}" '
        f"text-anchor=middle>peak requests of a key per {esc(window)} window "
        "(power-of-two bins)</text>"
    )
    drawn, rows = _legend(legend)
    parts, height = _below_legend(parts, rows)
    return _svg("keys by peak usage", drawn + parts, height=height, kind="histogram")


def _through(bins: Sequence[Sequence[Any]], count: int) -> list[Sequence[Any]]:
    """``bins`` with empty ones added up to the bin of ``count`` (so a mark above every key's
    peak still falls on the axis), before the bin of needs past the algorithm's counts."""
    finite = [b for b in bins if b[0] is not None]
    rest = [b for b in bins if b[0] is None]
    top = int(finite[-1][0]) if finite else 1
    while top < count:
        top *= 2
        finite.append([float(top), 0])
    return [*finite, *rest]


def _mark_x(bins: Sequence[Sequence[Any]], count: int, frame: Frame) -> float | None:
    """Where ``count`` falls on the histogram's x axis (within its power-of-two bin)."""
    for i, (bound, _) in enumerate(bins):
        if bound is None:
            return frame.x(i + 0.5)
        low = bound / 2 if bound > 1 else 0
        if low < count <= bound:
            return frame.x(i + (count - low) / (bound - low))
    return frame.x(len(bins)) if bins else None
