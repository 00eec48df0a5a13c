"""``LocalBudget`` while things change: a rate changed mid-window, a reset while other
processes hold slices, replies that arrive out of order, limits named that cannot be sliced.

Budgets sharing one store stand for processes (each its own slices), on every store, on a
``ManualClock``. What each must do is what a plain store does (``docs/algorithms.md``,
changing a rate; ``docs/local_budget.md``, resets), never more than the limit.
"""

from __future__ import annotations

import asyncio
import logging

import pytest

from ratekeeper import AsyncLimiter, Limiter, LocalBudget, ManualClock, MemoryStore
from ratekeeper.algorithms import slices
from ratekeeper.stores.slice_calls import SliceCall
from tests.conftest import Backend

START = 1_700_000_000.0
SLICED = ["fixed_window", "token_bucket", "gcra"]


def warm(limiter: Limiter, budget: LocalBudget, key: str, rate: str, n: int, **opts: object) -> int:
    """``n`` hits close together (slices grow with the demand); the admitted count. The
    budget must then hold unspent units, or the test proves nothing."""
    clock = limiter.clock
    admitted = 0
    for _ in range(n):
        admitted += limiter.hit(key, rate, **opts).allowed  # type: ignore[arg-type]
        clock.advance(0.0002)  # type: ignore[attr-defined]
    assert sum(h.unspent for h in budget.book.held.values()) > 0
    return admitted


def drain(limiter: Limiter, key: str, rate: str, most: int = 1000, **opts: object) -> int:
    """Hit until the first rejection (at most ``most``); the admitted count."""
    admitted = 0
    while admitted < most and limiter.hit(key, rate, **opts).allowed:  # type: ignore[arg-type]
        admitted += 1
    return admitted


@pytest.mark.parametrize("algorithm", SLICED)
def test_a_rate_change_mid_window_keeps_the_slice_accounting(
    backend: Backend, algorithm: str
) -> None:
    """40 used of 100/minute with a slice in hand: cut to 50, 10 more pass; raised to 150,
    100 more: what the plain memory store admits for the same calls, no false rejection."""
    backend.flush()
    clock = ManualClock(START)
    budget = LocalBudget(backend.store, clock=clock)
    limiter = Limiter(budget, clock=clock, fail_open=False)
    plain = Limiter(MemoryStore(), clock=clock, fail_open=False)
    opts = {"algorithm": algorithm}
    used = 0
    for _ in range(40):
        used += plain.hit("k", "100/minute", **opts).allowed
    assert warm(limiter, budget, "k", "100/minute", 40, **opts) == used == 40
    cut, raised = (
        drain(limiter, "k", "50/minute", **opts),
        drain(limiter, "k", "150/minute", **opts),
    )
    assert (cut, raised) == (
        drain(plain, "k", "50/minute", **opts),
        drain(plain, "k", "150/minute", **opts),
    )
    assert cut in (10, 11)  # gcra's conversion rounds down to the µs: at most one unit more
    assert 40 + cut + raised == 150
    assert budget.stats()["false_rejections"] == 0


@pytest.mark.parametrize("algorithm", SLICED)
def test_two_processes_on_two_rates_never_pass_the_higher(backend: Backend, algorithm: str) -> None:
    """A rate changed in one process before the other (a rolling reload): the window admits
    at most the higher rate, and each process's own slices move with its rate."""
    backend.flush()
    clock = ManualClock(START)
    budgets = [LocalBudget(backend.store, clock=clock) for _ in range(2)]
    limiters = [Limiter(b, clock=clock, fail_open=False) for b in budgets]
    opts = {"algorithm": algorithm}
    admitted = warm(limiters[0], budgets[0], "k", "100/minute", 30, **opts)
    admitted += warm(limiters[1], budgets[1], "k", "100/minute", 30, **opts)
    for i in range(600):
        rate = "60/minute" if i % 2 else "120/minute"
        admitted += limiters[i % 2].hit("k", rate, **opts).allowed
    assert 100 <= admitted <= 120


@pytest.mark.parametrize("algorithm", SLICED)
def test_a_reset_keeps_the_slices_other_processes_hold_counted(
    backend: Backend, algorithm: str
) -> None:
    """A resets the key while B holds a slice: B may still spend it, so it stays counted;
    after the reset the two admit the limit less what B had spent of that slice, never more."""
    backend.flush()
    clock = ManualClock(START)
    a_budget, b_budget = (LocalBudget(backend.store, clock=clock) for _ in range(2))
    a, b = (Limiter(x, clock=clock, fail_open=False) for x in (a_budget, b_budget))
    opts = {"algorithm": algorithm}
    warm(a, a_budget, "k", "100/minute", 10, **opts)  # A holds a slice too: it goes
    warm(b, b_budget, "k", "100/minute", 40, **opts)
    held = b_budget.book.held[(next(iter(b_budget.book.held))[0], "k")]
    spent_of_slice = held.granted - held.unspent
    a.reset("k", "100/minute", **opts)
    after = 0
    for i in range(400):  # B spends its slice, both take what the store has
        after += (b if i % 2 else a).hit("k", "100/minute", **opts).allowed
    assert after == 100 - spent_of_slice
    for x in (a_budget, b_budget):
        x.close()
    fresh = Limiter(LocalBudget(backend.store, clock=clock), clock=clock)
    assert fresh.peek("k", "100/minute", **opts).remaining == 100 - after - spent_of_slice


@pytest.mark.parametrize("algorithm", SLICED)
def test_a_reset_without_slices_keeps_them_counted_too(backend: Backend, algorithm: str) -> None:
    """A process without slices (a plain store, an admin tool) resets the key: the slices
    still held stay counted for the processes that take slices."""
    backend.flush()
    clock = ManualClock(START)
    budget = LocalBudget(backend.store, clock=clock)
    limiter = Limiter(budget, clock=clock, fail_open=False)
    opts = {"algorithm": algorithm}
    warm(limiter, budget, "k", "100/minute", 40, **opts)
    held = next(iter(budget.book.held.values()))
    spent_of_slice = held.granted - held.unspent
    Limiter(backend.store, clock=clock).reset("k", "100/minute", **opts)
    other = Limiter(LocalBudget(backend.store, clock=clock), clock=clock, fail_open=False)
    after = 0
    for i in range(400):
        after += (limiter if i % 2 else other).hit("k", "100/minute", **opts).allowed
    assert after == 100 - spent_of_slice


def test_a_stale_reply_never_overwrites_a_newer_slice(backend: Backend) -> None:
    """Two calls in flight on one event loop: a rejection for window W arrives after a slice
    of W+1 was installed. It answers its own request; every later decision points at W+1."""
    backend.flush()
    clock = ManualClock(START)
    budget = LocalBudget(backend.store, clock=clock)
    limiter = AsyncLimiter(budget, clock=clock, fail_open=False)
    rate = "10/second"
    take = budget.slicer.take_async
    ran, late = asyncio.Event(), asyncio.Event()
    stale: list[int] = []

    async def delayed(call: SliceCall) -> slices.Taken:
        taken = await take(call)  # run at once: the store decides it in its own window
        if call.now_ms in stale:
            ran.set()
            await late.wait()  # but its reply is late
        return taken

    budget.slicer.take_async = delayed  # type: ignore[method-assign]

    async def main() -> list[object]:
        for _ in range(10):
            assert (await limiter.hit("k", rate, aligned=True)).allowed
        stale.append(int(clock() * 1000 + 0.5))
        first = asyncio.ensure_future(limiter.hit("k", rate, aligned=True))  # W: rejected
        await ran.wait()
        clock.advance(1.0)  # window W+1
        newer = [await limiter.hit("k", rate, aligned=True) for _ in range(3)]
        late.set()
        old = await first
        later = [await limiter.hit("k", rate, aligned=True) for _ in range(6)]
        return [old, *newer, *later]

    old, *rest = asyncio.run(main())
    assert not old.allowed and old.reset_at > old.now  # type: ignore[attr-defined]
    assert all(d.allowed for d in rest)  # type: ignore[attr-defined]
    assert all(d.reset_at == rest[0].reset_at > d.now for d in rest)  # type: ignore[attr-defined]
    assert [d.remaining for d in rest] == list(range(9, 0, -1))  # type: ignore[attr-defined]


def test_a_stack_named_in_sliced_is_logged_once_and_counted(
    caplog: pytest.LogCaptureFixture,
) -> None:
    budget = LocalBudget(MemoryStore(), sliced=["10/minute", "1000/calendar-month"])
    limiters = [Limiter(budget), Limiter(budget)]  # two limiters: two policy objects
    with caplog.at_level(logging.WARNING, logger="ratekeeper"):
        for limiter in limiters * 3:
            limiter.hit("k", "10/minute; 100/hour")
            limiter.hit("k", "10/minute", algorithm="sliding_window")
            limiter.hit("k", "1000/calendar-month")
    refusals = [r.getMessage() for r in caplog.records if "cannot take slices" in r.getMessage()]
    assert len(refusals) == 3, refusals
    assert any("a stack of 2 rates" in m for m in refusals)
    assert any("sliding_window is not sliced" in m for m in refusals)
    assert any("a calendar rate" in m for m in refusals)
    assert budget.stats()["unsliced"] == 3
    assert budget.stats()["slices_taken"] == 0
