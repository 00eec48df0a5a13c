"""ManualClock: moves only when told, callable like time.time, safe to advance from threads."""

from __future__ import annotations

import threading

from ratekeeper import ManualClock


def test_moves_only_when_told() -> None:
    clock = ManualClock(start=1_700_000_000.0)
    assert clock() == clock.now() == 1_700_000_000.0
    clock.advance(1.5)
    assert clock() == 1_700_000_001.5
    clock.advance(-0.5)  # backwards, for clock-skew tests
    assert clock() == 1_700_000_001.0
    clock.set(5)
    assert clock() == 5.0 and isinstance(clock(), float)
    assert repr(clock) == "ManualClock(5.0)"


def test_advances_from_many_threads_all_count() -> None:
    clock = ManualClock(start=0.0)

    def tick() -> None:
        for _ in range(2000):
            clock.advance(1)

    threads = [threading.Thread(target=tick) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert clock() == 16_000.0
