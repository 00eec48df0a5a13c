"""The --html report opens in headless Chromium without errors, offline, and shows the run."""

from __future__ import annotations

import json
from pathlib import Path

from ratekeeper.cli import main
from tests.browser import Browser
from tests.simulate.traffic import generate


def test_html_report_opens_without_errors(tmp_path: Path) -> None:
    log = tmp_path / "access.log"
    log.write_text("".join(line.combined() for line in generate(seconds=300)) + "not a line\n")
    report = tmp_path / "report.html"
    code = main(
        ["simulate", str(log), "--limit", "per-ip=30/minute", "--limit", "loose=120/minute",
         "--algorithms", "fixed_window,token_bucket", "--html", str(report),
         "--json", str(tmp_path / "r.json"), "--no-progress"]
    )  # fmt: skip
    assert code == 0
    text = report.read_text()
    assert "http://" not in text.replace("http://www.w3.org/2000/svg", "")
    assert "https://" not in text and "<link" not in text
    data = json.loads((tmp_path / "r.json").read_text())
    browser = Browser()
    try:
        browser.open(report.as_uri())
        assert browser.errors == []
        assert browser.evaluate("document.querySelectorAll('section.limit').length") == 2
        shown = browser.evaluate(
            "Array.from(document.querySelectorAll('.would-reject')).map(e => e.textContent)"
        )
        assert shown == [f"{limit['would_reject']:,}" for limit in data["limits"]]
        assert browser.evaluate("document.querySelectorAll('section.limit svg').length") >= 6
        embedded = browser.evaluate(
            "JSON.parse(document.getElementById('report-data').textContent)"
        )
        assert embedded["limits"][0]["would_reject"] == data["limits"][0]["would_reject"]
        assert browser.evaluate("document.getElementById('top-0').offsetHeight") > 0
        browser.screenshot("simulate-report")
        assert browser.errors == []
    finally:
        browser.close()
