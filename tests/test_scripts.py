"""``./scripts/test`` tells what it does: each phase named when it starts, timed when it ends,
a summary of the phases with the total, and pytest's counts as the closing line, also when a
phase fails. Run as ``--quick`` on one test file (the full run is what runs this test)."""

from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def _quick(*args: str) -> subprocess.CompletedProcess[str]:
    if not (ROOT / ".venv" / "bin" / "pytest").exists():
        pytest.skip("no .venv in the checkout (./scripts/test makes it)")
    env = {**os.environ, "RATEKEEPER_TEST_WORKERS": "0"}
    return subprocess.run(
        ["./scripts/test", "--quick", *args],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )


def test_every_phase_is_named_and_timed_and_the_counts_close_the_run() -> None:
    out = _quick("tests/test_rates.py", "-p", "no:cacheprovider")
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-2000:]
    lines = out.stdout.splitlines()
    started = [line[3:].split(":")[0] for line in lines if line.startswith("== ")]
    assert started[:3] == ["ruff", "mypy --strict src", "pytest"], started
    for name in ("ruff", "mypy --strict src", "pytest"):
        assert any(re.fullmatch(rf"   \({re.escape(name)}: \d+ s\)", line) for line in lines), name
    summary = lines[lines.index("== phases of ./scripts/test --quick") + 1 :]
    assert [re.sub(r"^\s*\d+ s  ", "", line) for line in summary[:3]] == [
        "ruff",
        "mypy --strict src",
        "pytest",
    ]
    assert re.fullmatch(r"\s*\d+ s  total, exit status 0", summary[3])
    assert re.fullmatch(r"pytest: [1-9]\d* passed, 0 failed, 0 skipped", lines[-1]), lines[-1]


def test_a_failing_phase_is_named_in_the_summary_with_its_status() -> None:
    out = _quick("tests/test_rates.py", "-p", "no:cacheprovider", "--no-such-option")
    assert out.returncode == 4, out  # pytest's usage error, passed through
    assert re.search(r"^\s*\d+ s  pytest  \(failed\)$", out.stdout, re.M), out.stdout
    assert re.search(r"^\s*\d+ s  total, exit status 4$", out.stdout, re.M), out.stdout
