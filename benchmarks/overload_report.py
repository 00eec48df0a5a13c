"""Analysis and figures of ``bench_overload``: a run's raw data (``Run``), its summary (steady
state, critical latency, goodput, recovery), the SVG figures and the markdown table.

Kept apart from the runner so that ``--replot`` redraws from saved data without any server.
"""

from __future__ import annotations

import json
import statistics
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from benchmarks.overload_app import BUCKET
from benchmarks.svgplot import COLORS, Figure

TARGET_P99 = 0.100


@dataclass
class Run:
    """One scenario's raw data: server buckets, probe samples, phase boundaries (monotonic)."""

    app: str
    mode: str
    load: float
    capacity: float
    start: float
    overload: tuple[float, float]
    end: float
    rows: list[dict[str, Any]]
    probe: list[tuple[float, float, int]]
    wrk: list[dict[str, float]] = field(default_factory=list)


# -- analysis --------------------------------------------------------------------------------


def per_second(run: Run, key: str) -> list[tuple[float, float]]:
    """(seconds since start, per-second rate) of a bucket counter, e.g. ``low_200``."""
    return [(r["t"] - run.start, r.get(key, 0) / BUCKET) for r in run.rows if r["t"] >= run.start]


def shed_share(run: Run, t0: float, t1: float) -> float:
    rows = [r for r in run.rows if t0 <= r["t"] < t1]
    shed = sum(r.get("low_503", 0) for r in rows)
    total = shed + sum(r.get("low_200", 0) for r in rows)
    return shed / total if total else 0.0


def quantile(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def steady_state(run: Run) -> float:
    """When the run settles (see the module docstring): from the first second after which the
    low tier's shed share stays within 0.1 of its median over the overload's second half, and
    the critical median per second within 3x of its own."""
    t0, t1 = run.overload
    half = (t0 + t1) / 2

    def median_latency(a: float, b: float) -> float:
        values = [s[1] for s in run.probe if a <= s[0] < b]
        return statistics.median(values) if values else 0.0

    shares = [shed_share(run, t, t + 1) for t in _seconds(half, t1)]
    final_share = statistics.median(shares) if shares else 0.0
    final_latency = median_latency(half, t1)
    settled = t1
    for t in reversed(_seconds(t0, t1)):
        if (
            abs(shed_share(run, t, t + 1) - final_share) > 0.1
            or median_latency(t, t + 1) > 3 * final_latency
        ):
            break
        settled = t
    return settled


def _seconds(t0: float, t1: float) -> list[float]:
    return [t0 + i for i in range(int(t1 - t0))]


def cpu_share(run: Run, t0: float, t1: float) -> float:
    """The server process's CPU seconds per second between t0 and t1 (1.0: a whole core)."""
    rows = [r for r in run.rows if t0 <= r["t"] < t1 and "cpu" in r]
    if len(rows) < 2 or rows[-1]["t"] <= rows[0]["t"]:
        return float("nan")
    return float((rows[-1]["cpu"] - rows[0]["cpu"]) / (rows[-1]["t"] - rows[0]["t"]))


def summarize(run: Run) -> dict[str, Any]:
    """The figures of one run (times in seconds since the overload began)."""
    t0, t1 = run.overload
    settled = steady_state(run)
    steady = settled < t1 - 2
    if not steady:  # never settled: report the second half, flagged
        settled = (t0 + t1) / 2
    window = [s for s in run.probe if settled <= s[0] < t1]
    rows = [r for r in run.rows if settled <= r["t"] < t1]
    span = max(BUCKET, len(rows) * BUCKET)
    goodput = sum(r.get("low_200", 0) for r in rows) / span
    limits = [r["limit"] for r in rows if "limit" in r]
    recovered = recovery_time(run)
    return {
        "app": run.app,
        "mode": run.mode,
        "load": run.load,
        "capacity": run.capacity,
        "steady_after": settled - t0 if steady else None,
        "server_cpu": cpu_share(run, settled, t1),
        "critical_p50_ms": 1000 * quantile([s[1] for s in window], 0.50),
        "critical_p99_ms": 1000 * quantile([s[1] for s in window], 0.99),
        "critical_failed": sum(1 for s in window if s[2] != 200),
        "critical_sent": len(window),
        "critical_shed_total": sum(r.get("critical_503", 0) for r in run.rows),
        "goodput": goodput,
        "goodput_share": goodput / run.capacity,
        "shed_share": shed_share(run, settled, t1),
        "limit_median": statistics.median(limits) if limits else None,
        "recovered_after": recovered,
        "recovery_p99_ms": 1000
        * quantile([s[1] for s in run.probe if t1 + 1 <= s[0] < run.end], 0.99),
        "offered": run.wrk[1]["rps"] if len(run.wrk) > 1 else None,
    }


def recovery_time(run: Run) -> float | None:
    """Seconds after the overload until the last low-tier request is shed (the controller has
    let go); None if shedding goes on to the end of the recovery phase."""
    t1 = run.overload[1]
    last = t1
    for r in run.rows:
        if r["t"] >= t1 and r.get("low_503", 0) > 0:
            last = max(last, r["t"] + BUCKET)
    return None if last >= run.end - 1 else last - t1


# -- figures ---------------------------------------------------------------------------------


def figure(runs: list[Run], title: str) -> str:
    """Critical latency, low-tier goodput and shed rate, and each controller, over time."""
    fig = Figure(title)
    base = runs[0]
    fig.span(base.overload[0] - base.start, base.overload[1] - base.start, f"{base.load:g}x")
    fig.x_range = (0.0, base.end - base.start)
    latency = fig.panel("critical latency (ms, log)", log=True, y_min=1)
    latency.hline(TARGET_P99 * 1000, "100 ms")
    goodput = fig.panel("low tier: ok/s (solid), shed/s (dashed)", y_min=0)
    goodput.hline(base.capacity, "capacity")
    control = fig.panel("limit (adaptive) / drop % (worker)", y_min=0)
    for run, color in zip(runs, COLORS, strict=False):
        points = [(s[0] - run.start, s[1] * 1000) for s in run.probe]
        latency.points(points, run.mode, color)
        goodput.line(_smooth(per_second(run, "low_200")), f"{run.mode} ok", color)
        goodput.line(_smooth(per_second(run, "low_503")), f"{run.mode} shed", color, dashed=True)
        rows = [r for r in run.rows if r["t"] >= run.start]
        if any("limit" in r for r in rows):
            control.line(
                [(r["t"] - run.start, r["limit"]) for r in rows if "limit" in r],
                f"{run.mode} limit",
                color,
            )
        if any("drop_get" in r for r in rows):
            control.line(
                [(r["t"] - run.start, 100 * r["drop_get"]) for r in rows if "drop_get" in r],
                f"{run.mode} drop %",
                color,
            )
    return fig.svg()


def _smooth(points: list[tuple[float, float]], n: int = 4) -> list[tuple[float, float]]:
    """Mean of n buckets (one second), for readable rate lines."""
    return [
        (points[i][0], sum(y for _, y in points[i : i + n]) / len(points[i : i + n]))
        for i in range(0, len(points), n)
    ]


def sweep_figure(rows: list[dict[str, Any]], adaptive: dict[str, Any] | None, title: str) -> str:
    fig = Figure(title, x_label="fixed limit (AdmissionCheck(limit=N))")
    good = fig.panel("low-tier goodput (% of capacity)", y_min=0)
    lat = fig.panel("critical p99 (ms, log)", log=True, y_min=1)
    lat.hline(TARGET_P99 * 1000, "100 ms")
    good.line([(r["limit"], 100 * r["goodput_share"]) for r in rows], "fixed", COLORS[1])
    lat.line([(r["limit"], r["critical_p99_ms"]) for r in rows], "fixed", COLORS[1])
    if adaptive is not None and adaptive["limit_median"] is not None:
        x = adaptive["limit_median"]
        good.points([(x, 100 * adaptive["goodput_share"])], "adaptive", COLORS[0], radius=5)
        lat.points([(x, adaptive["critical_p99_ms"])], "adaptive", COLORS[0], radius=5)
    return fig.svg()


def table(rows: list[dict[str, Any]]) -> str:
    head = (
        "| app | mode | load | offered/s | steady after | critical p50 | critical p99 | "
        "critical shed | goodput/s | % of capacity | low shed | limit | recovered after | "
        "recovery p99 | server CPU |\n"
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"
    )
    lines = [head]
    for r in rows:
        rec = "—" if r["recovered_after"] is None else f"{r['recovered_after']:.1f} s"
        lim = "—" if r["limit_median"] is None else f"{r['limit_median']:g}"
        steady = "not settled" if r["steady_after"] is None else f"{r['steady_after']:.0f} s"
        lines.append(
            f"| {r['app']} | {r['mode']} | {r['load']:g}x | {r['offered'] or 0:.0f} | "
            f"{steady} | {r['critical_p50_ms']:.1f} ms | "
            f"{r['critical_p99_ms']:.1f} ms | {r['critical_shed_total']} "
            f"({r['critical_failed']} failed) | {r['goodput']:.0f} | "
            f"{100 * r['goodput_share']:.0f} % | {100 * r['shed_share']:.0f} % | {lim} | {rec} | "
            f"{r['recovery_p99_ms']:.0f} ms | {100 * r['server_cpu']:.0f} % |"
        )
    return "\n".join(lines)


def write_figures(runs: list[Run], out: Path) -> list[dict[str, Any]]:
    """The figures of a set of runs (by app and load; fixed limits as a sweep) and their
    summaries, in order."""
    results = [summarize(run) for run in runs]
    for app in dict.fromkeys(run.app for run in runs):
        for load in dict.fromkeys(r.load for r in runs if r.app == app):
            group = [r for r in runs if r.app == app and r.load == load and ":" not in r.mode]
            if group:
                name = "overload_{}_{}x.svg".format(app, f"{load:g}".replace(".", "_"))
                (out / name).write_text(figure(group, f"{app}: GET /low at {load:g}x capacity"))
        sweep = [
            row | {"limit": int(row["mode"][6:])}
            for row in results
            if row["app"] == app and row["mode"].startswith("fixed:")
        ]
        if sweep:
            adaptive = next(
                (r for r in results if r["app"] == app and r["mode"] == "adaptive"
                 and r["load"] == 3.0), None,
            )  # fmt: skip
            (out / f"overload_{app}_sweep.svg").write_text(
                sweep_figure(sweep, adaptive, f"{app}: fixed limits at 3x capacity")
            )
    return results


def replot(raw_path: Path, out: Path) -> None:
    """Figures and the table again from a ``--raw`` file, without running anything."""
    runs = []
    for d in json.loads(raw_path.read_text()):
        d["overload"] = tuple(d["overload"])
        d["probe"] = [tuple(x) for x in d["probe"]]
        runs.append(Run(**d))
    print(table(write_figures(runs, out)))
