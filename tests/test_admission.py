"""Admission control: the queue's rules on a ManualClock, then its thread and asyncio drivers."""

from __future__ import annotations

import asyncio
import threading
import time

import pytest

from ratekeeper import AdmissionQueue, AsyncAdmissionQueue, LoopLag, ManualClock
from ratekeeper.errors import ConfigError
from ratekeeper.overload.admission import AdmissionCore


def core(limit: int = 2, clock: ManualClock | None = None) -> AdmissionCore:
    return AdmissionCore(limit, clock=clock or ManualClock(0), target_delay=0.01, interval=0.1)


def test_fast_path_then_queue_then_most_important_first() -> None:
    c = core(limit=2)
    a, b = c.try_admit(2, 0.0), c.try_admit(3, 0.0)
    assert a is not None and b is not None
    assert c.try_admit(2, 0.0) is None  # full
    get1, decided = c.enqueue(2, 0.0)
    test1, _ = c.enqueue(3, 0.001)
    post1, _ = c.enqueue(1, 0.002)
    get2, _ = c.enqueue(2, 0.003)
    assert decided == [] and c.waiting == 4
    assert c.try_admit(1, 0.004) is None  # others wait: no overtaking through the fast path
    critical = c.try_admit(0, 0.004)
    assert critical is not None and c.in_flight == 3  # critical: at once, over the limit
    assert c.release(critical, 0.005) == []  # still at the limit
    assert c.release(a, 0.006) == [post1]  # the most important tier first
    assert c.release(post1.ticket, 0.007) == [get1]  # type: ignore[arg-type]  # granted above
    assert c.release(b, 0.008) == [get2]  # FIFO within a tier, before the lower tier
    assert test1.ticket is None and not test1.shed
    assert c.stats()["tiers"]["get"] == {"admitted": 3, "queued": 2, "shed": 0}


def test_codel_sheds_after_interval_or_target_under_a_standing_queue() -> None:
    c = core(limit=1)
    held = c.try_admit(2, 0.0)
    assert held is not None
    early, _ = c.enqueue(2, 0.0)
    # a passing burst may wait up to `interval`
    assert c.dispatch(0.09) == [] and c.max_wait(0.09) == 0.1
    assert c.dispatch(0.11) == [early] and early.shed
    # a queue that stays non-empty for `interval` is standing: waits are cut to `target_delay`
    first, _ = c.enqueue(2, 0.2)
    second, _ = c.enqueue(2, 0.25)
    assert c.dispatch(0.29) == [] and c.max_wait(0.29) == 0.1
    assert c.max_wait(0.305) == 0.01  # non-empty since 0.2: standing
    third, decided = c.enqueue(2, 0.305)
    assert decided == [first, second]  # both waited over 10 ms
    assert c.dispatch(0.314) == [] and c.dispatch(0.316) == [third]
    # once empty, the next burst may wait the long way again
    late, _ = c.enqueue(2, 0.32)
    assert c.dispatch(0.35) == [] and c.dispatch(0.43) == [late]
    c.release(held, 0.5)
    assert c.waiting == 0 and c.max_wait(0.4) == 0.1  # drained: back to the long wait


def test_abandon_removes_only_queued_waiters() -> None:
    c = core(limit=1)
    held = c.try_admit(2, 0.0)
    w, _ = c.enqueue(2, 0.0)
    assert c.abandon(w, 0.05) and w.shed and c.waiting == 0
    assert not c.abandon(w, 0.06)  # already decided
    w2, _ = c.enqueue(3, 0.07)
    c.release(held, 0.08)  # type: ignore[arg-type]  # granted at once
    assert w2.ticket is not None and not c.abandon(w2, 0.09)


def test_bad_configuration_names_the_value() -> None:
    with pytest.raises(ConfigError, match="limit=0"):
        AdmissionCore(0)
    with pytest.raises(ConfigError, match=r"target_delay=0\.5"):
        AdmissionCore(4, target_delay=0.5, interval=0.1)
    with pytest.raises(ConfigError, match="tier 'vip'"):
        core().tier_of("vip")


def test_thread_driver_blocks_until_a_slot_frees_or_sheds() -> None:
    queue = AdmissionQueue(AdmissionCore(1, target_delay=0.05, interval=0.2))
    held = queue.enter("get")
    assert held is not None
    assert queue.enter("get", wait=False) is None  # shadow mode: never waits
    got: list[object] = []
    waiter = threading.Thread(target=lambda: got.append(queue.enter("post")))
    waiter.start()
    deadline = time.monotonic() + 10
    while queue.core.waiting == 0 and time.monotonic() < deadline:
        time.sleep(0.001)
    queue.release(held)
    waiter.join(10)
    assert got and got[0] is not None  # woken with a ticket
    assert queue.core.in_flight == 1
    started = time.monotonic()
    assert queue.enter("get") is None  # nobody releases: shed after `interval`
    assert time.monotonic() - started >= 0.15
    queue.release(got[0])  # type: ignore[arg-type]  # a Ticket
    assert queue.core.in_flight == 0


def test_async_driver_queues_while_the_loop_lags() -> None:
    """With the loop lagging, requests go through the queue even below the limit, so at most
    ``limit`` run per turn; critical ones never wait."""
    clock = ManualClock(0)
    lag = LoopLag(clock=clock)
    queue = AsyncAdmissionQueue(AdmissionCore(2, clock=clock), lag)
    order: list[str] = []

    async def request(name: str, tier: str) -> None:
        ticket = await queue.enter(tier)
        order.append(name if ticket is not None else f"{name}:shed")
        queue.release(ticket)

    async def main() -> None:
        lag.record(0.0)
        await asyncio.gather(request("a", "get"), request("b", "get"), request("c", "get"))
        assert order == ["a", "b", "c"]  # healthy loop: straight through
        order.clear()
        lag.record(0.5)  # lagging
        tasks = [asyncio.create_task(request(n, "get")) for n in "defg"]
        tasks.append(asyncio.create_task(request("crit", "critical")))
        await asyncio.sleep(0)  # every request has entered once
        assert order == ["crit"]  # only the critical one ran in this turn
        assert queue.core.in_flight == 2 and queue.core.waiting == 2
        await asyncio.gather(*tasks)
        assert order == ["crit", "d", "e", "f", "g"]
        lag.detach()

    asyncio.run(main())


def test_async_driver_sheds_after_interval_and_cleans_up_on_cancel() -> None:
    queue = AsyncAdmissionQueue(AdmissionCore(1, target_delay=0.02, interval=0.05))

    async def main() -> None:
        held = await queue.enter("get")
        assert held is not None
        assert await queue.enter("get") is None  # shed by its timer after `interval`
        waiting = asyncio.create_task(queue.enter("get"))
        await asyncio.sleep(0.01)
        waiting.cancel()  # the client went away while queued
        with pytest.raises(asyncio.CancelledError):
            await waiting
        assert queue.core.waiting == 0
        granted = asyncio.create_task(queue.enter("get"))
        await asyncio.sleep(0.01)
        queue.release(held)  # grants the waiter...
        granted.cancel()  # ...which is cancelled before it runs: its slot comes back
        with pytest.raises(asyncio.CancelledError):
            await granted
        assert queue.core.in_flight == 0 and queue.core.waiting == 0
        queue.lag.detach()

    asyncio.run(main())
