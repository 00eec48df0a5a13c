"""The circuit breaker's states, timed by the caller's clock (no store, no sleeping)."""

from __future__ import annotations

import pytest

from ratekeeper import ConfigError
from ratekeeper.breaker import Breaker


def test_opens_after_threshold_failures_in_a_row() -> None:
    b = Breaker(3, 0.5, 30.0)
    assert not b.failed(100.0) and not b.failed(100.0)
    assert b.state == "failing" and b.allow(100.0)
    assert b.failed(100.0)
    assert b.state == "open"
    assert not b.allow(100.0) and not b.allow(100.49)


def test_a_success_before_the_threshold_starts_the_count_again() -> None:
    b = Breaker(3, 0.5, 30.0)
    b.failed(1.0)
    b.failed(1.0)
    b.succeeded()
    assert b.state == "closed"
    assert not b.failed(1.0) and not b.failed(1.0)
    assert b.failed(1.0)


def test_one_trial_after_the_cool_down_and_its_success_closes() -> None:
    b = Breaker(1, 0.5, 30.0)
    b.failed(10.0)
    assert b.allow(10.5)  # the trial
    assert not b.allow(10.5)  # others still skip while it runs
    b.succeeded()
    assert b.state == "closed" and b.allow(10.5)
    b.failed(11.0)
    assert not b.allow(11.4) and b.allow(11.5)  # the cool-down went back to 0.5 s


def test_failed_trials_double_the_cool_down_up_to_the_maximum() -> None:
    b = Breaker(1, 0.5, 3.0)
    now = 0.0
    b.failed(now)
    cooldowns = []
    for _ in range(5):
        start = now
        while not b.allow(now):
            now = round(now + 0.25, 2)
        cooldowns.append(now - start)
        b.failed(now)
    assert cooldowns == [0.5, 1.0, 2.0, 3.0, 3.0]


def test_failures_in_flight_when_it_opened_do_not_lengthen_the_cool_down() -> None:
    b = Breaker(3, 0.5, 30.0)
    for _ in range(10):  # ten concurrent calls fail together
        b.failed(5.0)
    assert b.cooldown == 0.5
    assert not b.allow(5.49) and b.allow(5.5)


@pytest.mark.parametrize(
    ("threshold", "cooldown", "max_cooldown", "bad"),
    [(0, 0.5, 30.0, "threshold=0"), (3, 0.0, 30.0, "cooldown=0.0"), (3, 5.0, 1.0, "5.0")],
)
def test_bad_settings_are_refused(
    threshold: int, cooldown: float, max_cooldown: float, bad: str
) -> None:
    with pytest.raises(ConfigError, match=bad):
        Breaker(threshold, cooldown, max_cooldown)
