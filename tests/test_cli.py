"""The ``ratekeeper`` console script, run as a real process: --version, --help and demo."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from ratekeeper import __version__
from ratekeeper.algorithms import ALGORITHMS
from ratekeeper.demo import ORDER, Traffic, report, run

SCRIPT = Path(sys.executable).with_name("ratekeeper")


def ratekeeper(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """The console script's run; ``env`` is added to this process's environment."""
    script = str(SCRIPT) if SCRIPT.exists() else shutil.which("ratekeeper")
    if script is None:
        pytest.fail("the ratekeeper console script is not installed (pip install -e .)")
    environ = {**os.environ, **env} if env else None
    return subprocess.run([script, *args], capture_output=True, text=True, timeout=60, env=environ)


def test_version() -> None:
    out = ratekeeper("--version")
    assert (out.returncode, out.stdout) == (0, f"ratekeeper {__version__}\n")


def test_help_lists_the_commands() -> None:
    out = ratekeeper("--help")
    assert out.returncode == 0
    assert "usage: ratekeeper" in out.stdout and "demo" in out.stdout
    out = ratekeeper("demo", "--help")
    assert out.returncode == 0 and "--rate" in out.stdout and "--algorithm" in out.stdout


def test_no_command_is_a_usage_error() -> None:
    out = ratekeeper()
    assert out.returncode == 2 and "required: COMMAND" in out.stderr


def test_demo_shows_every_algorithm_with_results_from_the_definitions() -> None:
    out = ratekeeper("demo")
    assert out.returncode == 0, out.stderr
    assert set(ORDER) == set(ALGORITHMS)
    rows = {line.split()[0]: line for line in out.stdout.splitlines() if line[:1].isalpha()}
    # 10/minute, 15 requests at once, then one every 5 s until 90 s. Each algorithm admits
    # its capacity of 10 from the burst. Afterwards: the fixed window opened at 0 reopens at 60
    # (t=60..90: 7 admitted); the log frees all 10 slots at 60 (7 admitted); the buckets refill
    # one token per 6 s, so of every six requests 5 s apart one finds less than a token (15);
    # the sliding counter, with 10 counted in minute 0, weighs them 10 x (1 - f) in minute 1,
    # so it admits its first at 1:10 only after the burst ages (5 of 18).
    expected = {
        "fixed_window": ("10 of 15", "7 of 18", "##########..... ...........#######"),
        "sliding_window": ("10 of 15", "5 of 18", "##########..... .............#####"),
        "sliding_log": ("10 of 15", "7 of 18", "##########..... ...........#######"),
        "token_bucket": ("10 of 15", "15 of 18", "##########..... .#####.#####.#####"),
        "gcra": ("10 of 15", "15 of 18", "##########..... .#####.#####.#####"),
    }
    for name, (burst, later, marks) in expected.items():
        assert f"{burst:<16}{later:<14}{marks}" in rows[name], rows[name]
    blocks = out.stdout.split("\n== ")[1:]
    retry = {b.split("\n")[0]: b.split("Retry-After: ")[1].split("\n")[0] for b in blocks}
    # the window ends at 60; the log's oldest entry leaves at 60; a token takes 6 s;
    # the sliding counter admits once 10 x (1 - f) <= 9, i.e. 6 s into minute 1: t=66
    assert retry == {
        "fixed_window": "60",
        "sliding_window": "66",
        "sliding_log": "60",
        "token_bucket": "6",
        "gcra": "6",
    }
    for block in blocks:
        assert 'RateLimit-Policy: "10/1m";q=10;w=60' in block
        assert "first rejection, t=0s: rejected (429)" in block
    assert ratekeeper("demo").stdout == out.stdout  # deterministic: a simulated clock
    assert out.stdout == report(
        Traffic("10/minute", 15, 5.0, 90.0), run(Traffic("10/minute", 15, 5.0, 90.0), ORDER)
    )


def test_demo_options() -> None:
    out = ratekeeper(
        "demo",
        "--algorithm",
        "gcra",
        "--rate",
        "2/second",
        "--burst",
        "3",
        "--every",
        "0.25",
        "--until",
        "1",
    )
    assert out.returncode == 0, out.stderr
    rows = [line for line in out.stdout.splitlines() if line[:1].isalpha()][2:]
    # burst of 3 at a capacity of 2; then at 0.25 s steps one unit frees every 0.5 s
    assert rows == ["gcra            2 of 3          2 of 4        ##. .#.#"]


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (("--rate", "ten/minute"), "ratekeeper demo: rate count 'ten' in 'ten/minute'"),
        (("--burst", "0"), "argument --burst: '0' is invalid; expected 1 to 10000 requests"),
        (("--every", "soon"), "argument --every: 'soon' is invalid; expected 0.001 to 86400"),
        (("--algorithm", "leaky"), "argument --algorithm: invalid choice: 'leaky'"),
        (("--every", "0.001", "--until", "60"), "60000 requests; expected at most 10000"),
    ],
)
def test_demo_bad_input_names_it(args: tuple[str, ...], message: str) -> None:
    out = ratekeeper("demo", *args)
    assert out.returncode == 2 and message in out.stderr, out.stderr


def test_healthcheck_with_a_port_that_is_no_number_exits_2() -> None:
    """A usage mistake, not an unhealthy service (docs/reference.md, "Exit status")."""
    out = ratekeeper("healthcheck", env={"RATEKEEPER_PORT": "eighty"})
    assert out.returncode == 2, out
    assert out.stderr == "ratekeeper healthcheck: port 'eighty' is not a number\n"
