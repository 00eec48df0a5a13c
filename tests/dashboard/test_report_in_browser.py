"""The --html report opens in headless Chromium without errors, offline, and shows what the
JSON and the terminal say: a real time axis (dates, the log's zone, gaps), legends and axis
titles, the top keys with every column and a timeline each, and the peak-usage histogram with
every bin and the candidate and suggestions marked. Screenshots go to build/screenshots/."""

from __future__ import annotations

import json
import random
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

from ratekeeper.cli import main
from tests.browser import Browser
from tests.simulate.traffic import generate

ZONE = timezone(timedelta(hours=-7))
START = 1_699_999_200  # on the hour: the outage is six whole hour buckets


def days_log(path: Path) -> None:
    """Three days in UTC-07:00 with a six-hour outage, ordinary clients and three heavy ones
    that stand apart."""
    rng = random.Random(1)
    rows = []
    for minute in range(3 * 24 * 60):
        if 30 * 60 <= minute < 36 * 60:
            continue
        for _ in range(rng.randrange(2, 9)):
            t = START + minute * 60 + rng.uniform(0, 60)
            heavy = rng.random() < 0.12
            ip = (
                f"203.0.113.{rng.randrange(3)}"
                if heavy
                else f"10.0.{rng.randrange(2)}.{rng.randrange(250)}"
            )
            when = datetime.fromtimestamp(t, ZONE).strftime("%d/%b/%Y:%H:%M:%S %z")
            rows.append((t, f'{ip} - - [{when}] "GET /api HTTP/1.1" 200 1 "-" "x"\n'))
    rows.sort()
    path.write_text("".join(line for _, line in rows))


def run(log: Path, tmp_path: Path, *limits: str) -> tuple[dict[str, Any], str, Path]:
    report = tmp_path / "report.html"
    out = tmp_path / "r.json"
    args = ["simulate", str(log), "--html", str(report), "--json", str(out), "--no-progress"]
    for limit in limits:
        args += ["--limit", limit]
    assert main(args) == 0
    text = report.read_text()
    assert "http://" not in text.replace("http://www.w3.org/2000/svg", "")
    assert "https://" not in text and "<link" not in text and "<script src" not in text
    return json.loads(out.read_text()), text, report


def texts(browser: Browser, selector: str) -> list[str]:
    return list(
        browser.evaluate(
            f"Array.from(document.querySelectorAll({selector!r})).map(e => e.textContent)"
        )
    )


def test_a_three_day_report_reads_like_a_chart(tmp_path: Path, capsys: Any) -> None:
    log = tmp_path / "access.log"
    days_log(log)
    data, _, report = run(log, tmp_path, "per-ip=20/hour", "burst=3/minute,algorithm=gcra")
    terminal = capsys.readouterr().out
    browser = Browser()
    try:
        browser.open(report.as_uri())
        assert browser.errors == []
        assert browser.evaluate("document.querySelectorAll('section.limit').length") == 2
        # the time axis: dates where days change, the log's zone named, the outage shaded
        first = "#limit-0 svg.timeline"
        ticks = texts(browser, f"{first} text.tick")
        assert any(t.startswith("Nov 15") for t in ticks) and any(
            t.startswith("Nov 17") for t in ticks
        )
        titles = texts(browser, f"{first} text.axis-title")
        assert titles[0] == "requests per hour"
        begin = datetime.fromtimestamp(data["first"], ZONE).strftime("%Y-%m-%d %H:%M")
        assert titles[1].startswith(f"time (UTC-07:00), {begin} to 2023-11-17")
        assert texts(browser, f"{first} text.legend") == [
            "requests",
            "would be rejected",
            "no lines in the log",
        ]
        gaps = browser.evaluate(f"document.querySelectorAll('{first} rect.gap').length")
        assert gaps == 1
        assert texts(browser, f"{first} rect.gap title") == ["no lines from 6 hours"]
        # the top keys: visible, every column, what the JSON says, a timeline each
        limit = data["limits"][0]
        assert browser.evaluate("document.getElementById('top-0').offsetHeight") > 0
        headers = texts(browser, "#top-0 th")
        assert headers == [
            "key", "requests", "share of traffic", "rejected", "of its requests", "first rejected",
            "last rejected", "rejecting window", "requests / rejections over time",
        ]  # fmt: skip
        rows = browser.evaluate(
            "Array.from(document.querySelectorAll('#top-0 tr')).slice(1).map("
            "r => Array.from(r.cells).slice(0, 8).map(c => c.textContent))"
        )
        assert len(rows) == len(limit["top_keys"]) == 3
        for row, top in zip(rows, limit["top_keys"], strict=True):
            assert row[0] == top["key"] and row[1] == f"{top['requests']:,}"
            assert row[3] == f"{top['rejections']:,}" and row[7] == f"20/1h ({top['rejections']:,})"
            assert row[5] == datetime.fromtimestamp(top["first_rejected"], ZONE).strftime(
                "%Y-%m-%d %H:%M:%S"
            )
            assert top["key"] in terminal and f"{top['rejections']:,}" in terminal
        assert browser.evaluate("document.querySelectorAll('#top-0 td svg.spark').length") == 3
        # the histogram: one bar per power-of-two bin from 1 up, the marks named in its legend
        [rate] = limit["rates"]
        [s] = rate["suggestions"]
        hist = "#limit-0 svg.histogram"
        bars = browser.evaluate(f"document.querySelectorAll('{hist} g.bin').length")
        bounds = [b[0] for b in s["distribution"]]
        assert bounds == [2.0**i for i in range(len(bounds))]
        assert bars >= len(bounds)  # every bin, and empty ones up to the highest mark
        assert texts(browser, f"{hist} text.axis-title") == [
            "keys (log scale)", "peak requests of a key per 1h window (power-of-two bins)",
        ]  # fmt: skip
        legend = texts(browser, f"{hist} text.legend")
        assert legend[:3] == ["keys", "candidate 20/1h", f"touches almost nobody: {s['rate']}"]
        assert legend[3] == f"stops the outliers: {s['outliers']['rate']}"
        for kind in ("candidate", "nobody", "outliers"):
            assert (
                browser.evaluate(f"document.querySelectorAll('{hist} line.mark.{kind}').length")
                == 1
            )
        # what the suggestions would do, as the JSON and the terminal say
        cells = texts(browser, "#limit-0 table.suggestions td")
        assert f"{s['outliers']['limited_keys']:,} of {rate['keys']:,}" in cells
        assert (
            f"{s['outliers']['rejected_requests']:,} ({s['outliers']['rejected_share']:.2%})"
            in cells
        )
        assert f"rejects {s['outliers']['rejected_requests']:,} requests" in terminal
        embedded = browser.evaluate(
            "JSON.parse(document.getElementById('report-data').textContent)"
        )
        assert embedded["limits"] == data["limits"]
        shown = texts(browser, ".would-reject")
        assert shown == [f"{x['would_reject']:,}" for x in data["limits"]]
        browser.screenshot("simulate-report-days")
        assert browser.errors == []
    finally:
        browser.close()


def test_a_short_report_with_bad_lines_opens_without_errors(tmp_path: Path) -> None:
    log = tmp_path / "access.log"
    log.write_text("".join(line.combined() for line in generate(seconds=300)) + "not a line\n")
    data, _, report = run(log, tmp_path, "per-ip=30/minute", "loose=120/minute")
    browser = Browser()
    try:
        browser.open(report.as_uri())
        assert browser.errors == []
        assert texts(browser, "section h2")[:2] == ["Logs", "Unparsable lines (samples)"]
        assert browser.evaluate("document.querySelectorAll('section.limit svg.chart').length") >= 4
        ticks = texts(browser, "#limit-0 svg.timeline text.tick")
        assert "22:15" in ticks  # minutes, one day: no date repeated on every tick
        assert data["unparsable"] == 1
        browser.screenshot("simulate-report")
    finally:
        browser.close()


def test_the_bounded_suggestion_is_marked_and_the_legend_wraps_clear_of_the_plot(
    tmp_path: Path,
) -> None:
    """With ``--reject-share`` the histogram has five legend entries: they wrap onto a
    second row inside the chart's width, and the plot moves down below them."""
    log = tmp_path / "access.log"
    days_log(log)
    report, out = tmp_path / "report.html", tmp_path / "r.json"
    assert main(["simulate", str(log), "--limit", "per-ip=20/hour", "--reject-share", "0.01",
                 "--html", str(report), "--json", str(out), "--no-progress"]) == 0  # fmt: skip
    s = json.loads(out.read_text())["limits"][0]["rates"][0]["suggestions"][0]
    assert s["requests"]["count"] is not None and s["outliers"] is not None
    browser = Browser()
    try:
        browser.open(report.as_uri())
        assert browser.errors == []
        hist = "#limit-0 svg.histogram"
        legend = texts(browser, f"{hist} text.legend")
        assert legend[-1] == f"rejects at most 1.00%: {s['requests']['rate']}"
        marks = f"document.querySelectorAll('{hist} line.mark.requests').length"
        assert browser.evaluate(marks) == 1
        box = browser.evaluate(
            f"(() => {{ const svg = document.querySelector('{hist}').getBoundingClientRect();"
            f" const r = e => e.getBoundingClientRect();"
            f" const texts = Array.from(document.querySelectorAll('{hist} text.legend')).map(r);"
            f" const grid = Array.from(document.querySelectorAll('{hist} line.grid')).map(r);"
            " return {left: svg.left, right: svg.right,"
            " rows: new Set(texts.map(t => Math.round(t.top))).size,"
            " textRight: Math.max(...texts.map(t => t.right)),"
            " textBottom: Math.max(...texts.map(t => t.bottom)),"
            " plotTop: Math.min(...grid.map(g => g.top))}; })()"
        )
        assert box["rows"] == 2
        assert box["textRight"] <= box["right"]
        assert box["textBottom"] <= box["plotTop"]
        browser.screenshot("report-reject-share.png")
    finally:
        browser.close()
