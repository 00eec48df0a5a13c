"""A small SVG plotter for benchmark figures: stacked panels sharing an x axis, no dependency.

fig = Figure("title", x_label="seconds")
panel = fig.panel("latency (ms)", log=True)
panel.line([(0, 1), (1, 3)], "adaptive", color=COLORS[0])
panel.points([(0.5, 2)], "probe", color=COLORS[1])
Path("out.svg").write_text(fig.svg())
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from html import escape

COLORS = ("#d62728", "#1f77b4", "#2ca02c", "#9467bd", "#ff7f0e", "#8c564b", "#17becf")
Point = tuple[float, float]


@dataclass
class _Series:
    points: list[Point]
    label: str
    color: str
    kind: str  # "line" or "points"
    dashed: bool = False
    radius: float = 1.6


@dataclass
class Panel:
    """One plot area: its y label, scale and series; ``hline``/``vspan`` mark levels and spans."""

    y_label: str
    log: bool = False
    y_min: float | None = None
    y_max: float | None = None
    series: list[_Series] = field(default_factory=list)
    hlines: list[tuple[float, str]] = field(default_factory=list)

    def line(self, points: list[Point], label: str, color: str, dashed: bool = False) -> None:
        self.series.append(_Series(points, label, color, "line", dashed))

    def points(self, points: list[Point], label: str, color: str, radius: float = 1.6) -> None:
        self.series.append(_Series(points, label, color, "points", radius=radius))

    def hline(self, y: float, label: str) -> None:
        self.hlines.append((y, label))

    def y_range(self) -> tuple[float, float]:
        ys = [y for s in self.series for _, y in s.points] + [y for y, _ in self.hlines]
        if self.log:
            ys = [y for y in ys if y > 0]
        lo = self.y_min if self.y_min is not None else (min(ys) if ys else 0.0)
        hi = self.y_max if self.y_max is not None else (max(ys) if ys else 1.0)
        if self.log:
            lo = 10 ** math.floor(math.log10(max(lo, 1e-9)))
            hi = 10 ** math.ceil(math.log10(max(hi, lo * 10)))
        elif hi <= lo:
            hi = lo + 1
        return lo, hi


def _ticks(lo: float, hi: float, log: bool) -> list[float]:
    if log:
        return [10.0**e for e in range(round(math.log10(lo)), round(math.log10(hi)) + 1)]
    raw = (hi - lo) / 5
    step = 10 ** math.floor(math.log10(raw))
    for m in (1, 2, 5, 10):
        if raw <= m * step:
            step *= m
            break
    first = math.ceil(lo / step) * step
    return [first + i * step for i in range(int((hi - first) / step) + 1)]


def _fmt(v: float) -> str:
    return f"{v:g}" if abs(v) < 1e5 else f"{v:.0e}"


class Figure:
    """Panels stacked vertically over one x axis, with spans shaded across all of them."""

    def __init__(self, title: str, x_label: str = "seconds", width: int = 900) -> None:
        self.title = title
        self.x_label = x_label
        self.width = width
        self.panels: list[Panel] = []
        self.spans: list[tuple[float, float, str]] = []
        self.x_range: tuple[float, float] | None = None

    def panel(self, y_label: str, log: bool = False, **kw: float) -> Panel:
        panel = Panel(y_label, log, **kw)  # type: ignore[arg-type]  # y_min / y_max
        self.panels.append(panel)
        return panel

    def span(self, x0: float, x1: float, label: str) -> None:
        self.spans.append((x0, x1, label))

    def svg(self) -> str:
        left, right, top, panel_h, gap = 70, 190, 40, 170, 30
        height = top + len(self.panels) * (panel_h + gap) + 30
        plot_w = self.width - left - right
        xs = [x for p in self.panels for s in p.series for x, _ in s.points]
        x0, x1 = self.x_range or ((min(xs), max(xs)) if xs else (0.0, 1.0))
        if x1 <= x0:
            x1 = x0 + 1

        def sx(x: float) -> float:
            return left + (x - x0) / (x1 - x0) * plot_w

        out = [
            f'<svg xmlns="http://www.w3.org/2000/svg" width="{self.width}" height="{height}" '
            f'font-family="sans-serif" font-size="11">',
            f'<rect width="{self.width}" height="{height}" fill="white"/>',
            f'<text x="{left}" y="22" font-size="14" font-weight="bold">'
            f"{escape(self.title)}</text>",
        ]
        for i, panel in enumerate(self.panels):
            y_top = top + i * (panel_h + gap)
            lo, hi = panel.y_range()

            def sy(
                y: float,
                lo: float = lo,
                hi: float = hi,
                y_top: float = y_top,
                log: bool = panel.log,
            ) -> float:
                if log:
                    y = max(y, lo)
                    frac = (math.log10(y) - math.log10(lo)) / (math.log10(hi) - math.log10(lo))
                else:
                    frac = (y - lo) / (hi - lo)
                return y_top + panel_h - min(1.0, max(0.0, frac)) * panel_h

            for a, b, label in self.spans:
                xa, xb = sx(max(a, x0)), sx(min(b, x1))
                out.append(
                    f'<rect x="{xa:.1f}" y="{y_top}" width="{max(0.0, xb - xa):.1f}" '
                    f'height="{panel_h}" fill="#f3e3e3"/>'
                )
                if i == 0:
                    out.append(
                        f'<text x="{xa + 3:.1f}" y="{y_top - 4}" fill="#a33">{escape(label)}</text>'
                    )
            out.append(
                f'<rect x="{left}" y="{y_top}" width="{plot_w}" height="{panel_h}" '
                'fill="none" stroke="#333"/>'
            )
            for t in _ticks(lo, hi, panel.log):
                y = sy(t)
                out.append(
                    f'<line x1="{left}" x2="{left + plot_w}" y1="{y:.1f}" y2="{y:.1f}" '
                    'stroke="#ddd"/>'
                )
                out.append(
                    f'<text x="{left - 4}" y="{y + 4:.1f}" text-anchor="end">{_fmt(t)}</text>'
                )
            out.append(
                f'<text transform="translate(14,{y_top + panel_h / 2}) rotate(-90)" '
                f'text-anchor="middle">{escape(panel.y_label)}</text>'
            )
            for y, label in panel.hlines:
                yy = sy(y)
                out.append(
                    f'<line x1="{left}" x2="{left + plot_w}" y1="{yy:.1f}" y2="{yy:.1f}" '
                    'stroke="#555" stroke-dasharray="2,3"/>'
                )
                out.append(
                    f'<text x="{left + 4}" y="{yy - 3:.1f}" fill="#555">{escape(label)}</text>'
                )
            legend_y = y_top + 12
            for s in panel.series:
                pts = [(sx(x), sy(y)) for x, y in s.points if x0 <= x <= x1]
                if s.kind == "line" and pts:
                    dash = ' stroke-dasharray="5,3"' if s.dashed else ""
                    path = " ".join(f"{x:.1f},{y:.1f}" for x, y in pts)
                    out.append(
                        f'<polyline points="{path}" fill="none" stroke="{s.color}" '
                        f'stroke-width="1.5"{dash}/>'
                    )
                else:
                    out.extend(
                        f'<circle cx="{x:.1f}" cy="{y:.1f}" r="{s.radius}" fill="{s.color}" '
                        'fill-opacity="0.6"/>'
                        for x, y in pts
                    )
                lx = left + plot_w + 10
                out.append(
                    f'<line x1="{lx}" x2="{lx + 18}" y1="{legend_y - 4}" y2="{legend_y - 4}" '
                    f'stroke="{s.color}" stroke-width="3"/>'
                )
                out.append(f'<text x="{lx + 22}" y="{legend_y}">{escape(s.label)}</text>')
                legend_y += 15
        y_axis = top + len(self.panels) * (panel_h + gap) - gap
        for t in _ticks(x0, x1, False):
            x = sx(t)
            out.append(f'<text x="{x:.1f}" y="{y_axis + 14}" text-anchor="middle">{_fmt(t)}</text>')
        out.append(
            f'<text x="{left + plot_w / 2}" y="{y_axis + 28}" text-anchor="middle">'
            f"{escape(self.x_label)}</text>"
        )
        out.append("</svg>")
        return "\n".join(out) + "\n"
