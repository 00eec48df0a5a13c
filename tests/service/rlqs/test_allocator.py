"""The quota step: its rules on chosen timelines, its invariant (the sum of assigned rates
never exceeds the global rate) under random traffic, and the Lua twin deciding exactly like
the Python step on every Redis store (real servers)."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ratekeeper.service.envoy.rlqs import allocator
from ratekeeper.service.envoy.rlqs.allocator import Record, Step, step
from ratekeeper.service.envoy.rlqs.state import MemoryQuotaState, RedisQuotaState, quota_state
from tests.conftest import Backend

R = allocator.MRPS  # one request a second
HOLD = 21_000


def run(records: dict[str, Record], stream: str, now: int, demand: int, limit: int = 60 * R,
        **kw: object) -> tuple[allocator.Grant, dict[str, Record]]:  # fmt: skip
    return step(records, Step(stream, now, demand, limit, HOLD, **kw))  # type: ignore[arg-type]


def test_the_docstrings_timeline() -> None:
    grant, records = run({}, "a", 0, 100 * R)
    assert grant.assigned == 60 * R and grant.envoys == 1
    grant, records = run(records, "b", 10, -1)  # b joins, demand unknown: needs 30
    assert (grant.target, grant.assigned, grant.held) == (30 * R, 0, 60 * R)
    grant, records = run(records, "a", 20, 100 * R)  # its process re-steps a
    assert grant.assigned == 30 * R
    grant, records = run(records, "b", 30, -1)
    assert grant.assigned == 30 * R and grant.envoys == 2
    grant, records = run(records, "a", 5000, 10 * R)  # a's demand falls: 11 + 9.5
    assert grant.assigned == 20_500
    grant, records = run(records, "b", 5010, -1)
    assert grant.assigned == 39_500
    assert sum(r.assigned for r in records.values()) == 60 * R


def test_a_small_move_keeps_the_assignment() -> None:
    """Envoy starts a new, full token bucket on every change: moves within the band are not
    made."""
    _, records = run({}, "a", 0, 30 * R)
    _, records = run(records, "b", 0, 100 * R)
    _, records = run(records, "a", 0, 30 * R)
    before = records["a"].assigned
    grant, records = run(records, "a", 5000, 31 * R)  # 34.1 needed, a 3 % move
    assert grant.assigned == before


def test_an_expired_record_frees_its_share() -> None:
    _, records = run({}, "a", 0, 100 * R)
    grant, records = run(records, "b", HOLD - 1, 100 * R)
    assert grant.assigned == 0  # a holds everything, fresh enough to keep it
    grant, records = run(records, "b", HOLD, 100 * R)
    assert grant.assigned == 60 * R and set(records) == {"b"}


def test_a_stale_record_is_held_but_gets_no_target() -> None:
    _, records = run({}, "a", 0, 100 * R)
    grant, _ = run(records, "b", allocator.STALE_MS + 1, 100 * R)
    assert grant.envoys == 1 and grant.target == 60 * R and grant.assigned == 0


def test_a_reconnecting_stream_adopts_an_orphan_and_is_capped() -> None:
    _, records = run({}, "a", 0, 100 * R)
    _, records = run(records, "b", 0, 100 * R)
    _, records = run(records, "a", 0, 100 * R)
    _, records = run(records, "b", 0, 100 * R)
    assert records["a"].assigned == records["b"].assigned == 30 * R
    records = allocator.orphan(allocator.orphan(records, "a"), "b")  # the service stops
    grant, records = run(records, "a2", 3000, 100 * R, adopt=True, cap=31 * R)
    assert grant.assigned == 30 * R and len(records) == 2  # a's or b's reservation, taken
    grant, records = run(records, "b2", 3100, 100 * R)  # no adopt: only what is free
    assert grant.assigned == 0
    grant, records = run(records, "b2", 3200, 100 * R, adopt=True, cap=31 * R)
    assert grant.assigned == 30 * R and set(records) == {"a2", "b2"}


def test_the_cap_holds_a_restarted_services_first_assignment() -> None:
    grant, _ = run({}, "a", 0, 100 * R, adopt=True, cap=20 * R)
    assert grant.assigned == 20 * R and grant.target == 60 * R


def test_dropping_a_stream_frees_its_share_at_once() -> None:
    _, records = run({}, "a", 0, 100 * R)
    records = allocator.drop(records, "a")
    grant, _ = run(records, "b", 1, 100 * R)
    assert grant.assigned == 60 * R


events = st.lists(
    st.tuples(
        st.sampled_from(["a", "b", "c", "d", "e"]),
        st.integers(0, 9_000),  # ms later
        st.one_of(st.just(-1), st.integers(0, 200 * R)),
        st.sampled_from(["step", "step", "step", "adopt", "drop", "orphan"]),
        st.one_of(st.just(-1), st.integers(0, 80 * R)),
        st.sampled_from([60 * R, 60 * R, 7 * R, 1]),
    ),
    max_size=40,
)


@given(events)
def test_the_sum_never_exceeds_the_global_rate(script: list[tuple]) -> None:  # type: ignore[type-arg]
    records: dict[str, Record] = {}
    now = 0
    limit = 60 * R
    for stream, later, demand, op, cap, new_limit in script:
        now += later
        if new_limit != limit:  # a reload lowers or raises it: only new grants obey at once
            limit = new_limit
            continue
        if op == "drop":
            records = allocator.drop(records, stream)
        elif op == "orphan":
            records = allocator.orphan(records, stream)
        else:
            before = sum(r.assigned for k, r in records.items() if r.expires_ms > now)
            mine = records.get(stream)
            kept = 0 if mine is None or mine.expires_ms <= now else mine.assigned
            grant, records = run(records, stream, now, demand, limit, cap=cap,
                                 adopt=op == "adopt")  # fmt: skip
            after = sum(r.assigned for r in records.values())
            assert after <= max(limit, before)
            assert grant.assigned <= grant.target or 0 < grant.assigned <= kept or op == "adopt"
            if before <= limit:
                assert after <= limit


# --- the Lua twin ----------------------------------------------------------------------------


@pytest.fixture
def loop() -> Iterator[asyncio.AbstractEventLoop]:
    loop = asyncio.new_event_loop()
    yield loop
    loop.close()


@settings(
    max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(script=events, start=st.sampled_from([0, 1_700_000_000_000, 9_999_999_900_000]))
def test_the_lua_twin_decides_as_the_python_step(
    redis_backend: Backend, loop: asyncio.AbstractEventLoop, script: list[tuple],  # type: ignore[type-arg]
    start: int,
) -> None:  # fmt: skip
    redis_backend.flush()
    state = quota_state(redis_backend.store)
    assert isinstance(state, RedisQuotaState)
    memory = MemoryQuotaState()
    bucket = f"bucket {{{start}}}"
    now = start
    limit = 60 * R

    async def both() -> None:
        nonlocal now, limit
        for stream, later, demand, op, cap, new_limit in script:
            now += later
            if op in ("drop", "orphan"):
                for side in (state, memory):
                    await side.leave(bucket, stream, now, keep=op == "orphan")
            else:
                s = Step(stream, now, demand, new_limit, HOLD, cap, op == "adopt")
                assert await state.step(bucket, s) == await memory.step(bucket, s)
            stored = await state.records(bucket)
            kept = {k: r for k, r in memory.buckets.get(bucket, {}).items() if r.expires_ms > now}
            assert {k: r for k, r in stored.items() if r.expires_ms > now} == kept

    loop.run_until_complete(both())
