"""Overload signals: scripted with a ManualClock; the loop-lag timer also against a real loop."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import pytest

from ratekeeper import LoopLag, ManualClock, Pressure, ProcessCPU, QueueDelay
from ratekeeper.errors import ConfigError
from ratekeeper.overload.signals import parse_request_start, worst


def test_loop_lag_averages_its_window() -> None:
    clock = ManualClock(100.0)
    lag = LoopLag(saturated_at=0.05, window=1.0, clock=clock)
    assert lag() == 0.0  # no loop, no samples: reads idle
    for value in (0.01, 0.03, 0.05):
        lag.record(value)
        clock.advance(0.3)
    assert lag.lag() == pytest.approx(0.03)
    assert lag() == pytest.approx(0.6)
    clock.advance(0.5)  # the first two samples leave the window
    assert lag.lag() == pytest.approx(0.05)
    lag.record(0.5)
    assert lag() == 1.0  # clipped at saturated
    clock.advance(2)
    assert lag.lag() == 0.0


def test_loop_lag_times_a_real_loop_and_sees_it_blocked() -> None:
    """A callback that blocks the loop 0.2 s: the timer is overdue by at least 0.15 s."""
    lag = LoopLag(every=0.01)

    async def main() -> tuple[float, float]:
        lag()  # starts the timer on this loop
        await asyncio.sleep(0.05)
        idle = lag.lag()
        time.sleep(0.2)  # the loop is stuck: no timer can fire
        return idle, lag.lag()

    idle, blocked = asyncio.run(main())
    assert blocked >= 0.15
    assert blocked > idle
    lag.detach()


def test_loop_lag_follows_a_new_loop() -> None:
    lag = LoopLag(every=0.01)

    async def tick() -> None:
        lag()
        await asyncio.sleep(0.03)

    asyncio.run(tick())
    first = lag._loop
    asyncio.run(tick())
    assert lag._loop is not first and lag._loop is not None
    lag.detach()
    assert lag._loop is None


@pytest.mark.parametrize(
    ("raw", "expected"),
    [
        ("t=1700000000.123", 1700000000.123),  # nginx: seconds with ms
        ("1700000000123", 1700000000.123),  # Heroku: ms
        ("t=1700000000123456", 1700000000.123456),  # Apache %t: µs
        ("1700000000123456789", 1700000000.123456789),  # ns
        (b"1700000000", 1700000000.0),
        ("garbage", None),
        ("t=", None),
        ("-5", None),
        ("inf", None),
        (None, None),
        (True, None),
    ],
)
def test_parse_request_start(raw: object, expected: float | None) -> None:
    got = parse_request_start(raw)
    if expected is None:
        assert got is None
    else:
        assert got == pytest.approx(expected, abs=1e-6)


def test_queue_delay_from_arrival_stamps_ignores_skew() -> None:
    clock = ManualClock(1_700_000_000.0)
    delay = QueueDelay(saturated_at=0.1, window=1.0, max_skew=10, clock=clock)
    delay.record(clock() - 0.02)
    delay.record(clock() - 0.06)
    assert delay.delay() == pytest.approx(0.04)
    assert delay() == pytest.approx(0.4)
    delay.record(clock() - 3600)  # another host's clock an hour off: not a delay
    delay.record(clock() + 3600)
    assert delay.delay() == pytest.approx(0.04)
    delay.record(clock() + 0.001)  # a stamp slightly ahead counts as no delay
    assert delay.delay() == pytest.approx(0.08 / 3)
    clock.advance(1.5)
    assert delay() == 0.0


def test_pressure_reads_psi_avg10(tmp_path: Path) -> None:
    psi = tmp_path / "cpu.pressure"
    psi.write_text(
        "some avg10=40.00 avg60=10.00 avg300=2.00 total=123\n"
        "full avg10=5.50 avg60=1.00 avg300=0.00 total=45\n"
    )
    clock = ManualClock(0)
    some = Pressure(path=psi, saturated_at=80, every=1.0, clock=clock)
    full = Pressure("memory", line="full", path=psi, saturated_at=11, clock=clock)
    assert some.available()
    assert some() == pytest.approx(0.5) and some.percent() == 40.0
    assert full() == pytest.approx(0.5)
    psi.write_text("some avg10=80.00 avg60=0 avg300=0 total=1\n")
    assert some.percent() == 40.0  # cached for `every` seconds
    clock.advance(1)
    assert some() == 1.0
    missing = Pressure(path=tmp_path / "nope")
    assert not missing.available() and missing() == 0.0


def test_process_cpu_share_of_cores() -> None:
    clock = ManualClock(0)
    cpu = [0.0]
    signal = ProcessCPU(cores=2, every=1.0, clock=clock, cpu_time=lambda: cpu[0])
    assert signal() == 0.0  # first reading: nothing to compare with
    clock.advance(1)
    cpu[0] = 1.5
    assert signal() == pytest.approx(0.75)
    clock.advance(0.5)
    cpu[0] = 1.5
    assert signal() == pytest.approx(0.75)  # too soon: the last share
    clock.advance(0.5)
    assert signal() == pytest.approx(0.0)


def test_worst_of_signals() -> None:
    assert worst(lambda: 0.2, lambda: 0.7, lambda: 0.1)() == 0.7
    with pytest.raises(ConfigError, match=r"signals=\(\)"):
        worst()


@pytest.mark.parametrize(
    ("make", "needle"),
    [
        (lambda: LoopLag(saturated_at=0), "saturated_at=0"),
        (lambda: LoopLag(every=-1), "every=-1"),
        (lambda: QueueDelay(window=0), "window=0"),
        (lambda: Pressure("disk"), "resource 'disk'"),
        (lambda: Pressure(line="most"), "line 'most'"),
        (lambda: ProcessCPU(cores=True), "cores=True"),
    ],
)
def test_bad_signal_settings_name_the_value(make: object, needle: str) -> None:
    with pytest.raises(ConfigError, match=needle):
        make()  # type: ignore[operator]  # each case is a zero-argument callable
