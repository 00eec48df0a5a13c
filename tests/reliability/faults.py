"""Fault scenarios on real redis-server processes under multi-process load.

Each function starts its own servers, runs a ``Load``, breaks something at a fixed point of
the load's timeline, and returns ``Row``s with the figures. ``quick=True`` shortens the
timeline for the pytest subset; the checks are the same.
"""

from __future__ import annotations

import itertools
import time
from collections.abc import Callable
from typing import Any

from ratekeeper import Limiter, ManualClock, Shard, ShardedRedisStore
from tests import redis_servers as rs
from tests.reliability.load import Load, LoadSpec, Result, StoreSpec, percentile
from tests.reliability.report import Row

TIMEOUT = 0.05  # the stores' default socket_timeout: the full run
QUICK_TIMEOUT = 0.5  # the pytest subset shares a loaded machine: 50 ms, even 250 ms, is
# missed when healthy (a degraded answer outside the outage fails the scenario)


def _timeout(quick: bool) -> float:
    return QUICK_TIMEOUT if quick else TIMEOUT


KEYS = tuple(f"user:{i}" for i in range(64))


def _ms(seconds: float) -> str:
    return f"{seconds * 1000:.1f} ms"


def _recovery(result: Result, since: float) -> float | None:
    """Seconds from ``since`` until the last worker process-thread got a non-degraded answer.

    Approximated over all records: the latest "first healthy answer" of any key after
    ``since``; None when some key never got one.
    """
    first: dict[int, float] = {}
    for start, latency, _allowed, degraded, key in result.records:
        if start >= since and not degraded and key not in first:
            first[key] = start + latency
    if len(first) < len({r[4] for r in result.records}):
        return None
    return max(first.values()) - since


def outage(kind: str, quick: bool) -> list[Row]:
    """SIGKILL (then restart empty) or SIGSTOP (then SIGCONT) the only Redis mid-load."""
    down_at, up_at, duration = (0.6, 1.8, 4.0) if quick else (2.0, 5.0, 9.0)
    timeout = _timeout(quick)
    server = rs.RedisServer()
    try:
        store = StoreSpec("redis", (server.url,), socket_timeout=_timeout(quick))
        load = Load(_spec(store, quick, duration))
        load.at(down_at)
        t_down = load.start_at + down_at
        if kind == "kill":
            server.kill()
        else:
            server.pause()
        load.at(up_at)
        if kind == "kill":
            server.start()  # empty: no data, no scripts
        else:
            server.resume()
        t_up = load.start_at + up_at
        result = load.join()
    finally:
        server.stop()
    healthy = [r[1] for r in result.between(load.start_at, t_down - 0.2)]
    down = result.between(t_down, t_up)
    p99_down = percentile([r[1] for r in down], 0.99)
    p99_ok = percentile(healthy, 0.99)
    degraded = sum(r[3] for r in result.records)
    recovery = _recovery(result, t_up)
    relapsed = sum(r[3] for r in result.between(t_up + (recovery or 0) + 0.1, float("inf")))
    fault = (
        f"primary SIGKILL for {up_at - down_at:.1f} s, restarted empty"
        if kind == "kill"
        else f"primary SIGSTOP {up_at - down_at:.1f} s, then SIGCONT"
    )
    ok_answers = not result.errors and all(r[2] for r in down)
    max_down = max((r[1] for r in down), default=0.0)  # none while down: the row fails
    return [
        Row(
            fault,
            "every request answered, none raised; degraded answers only while down",
            f"{len(result.records)} answered, {len(result.errors)} raised, {degraded} degraded"
            f" ({len(down)} requests while down)",
            ok_answers and not any(r[3] for r in result.between(load.start_at, t_down - 0.2)),
        ),
        Row(
            fault,
            f"latency p99 while down < 2x socket_timeout ({_ms(2 * timeout)})",
            f"p99 {_ms(p99_down)} while down (healthy p99 {_ms(p99_ok)}; "
            f"added {_ms(max(0.0, p99_down - p99_ok))}), max {_ms(max_down)}",
            bool(down) and p99_down < 2 * timeout,
        ),
        Row(
            fault,
            "recovery: every key decided by Redis again after it is back, and no relapse",
            "never"
            if recovery is None
            else f"{recovery:.2f} s after {'restart' if kind == 'kill' else 'SIGCONT'} "
            f"(breaker cool-down doubles from 0.5 s while down); then {relapsed} degraded",
            recovery is not None and relapsed == 0,
        ),
    ]


def _spec(store: StoreSpec, quick: bool, duration: float, **options: Any) -> LoadSpec:
    """2 processes x 2 threads for the quick subset, 3 x 2 for the full run."""
    return LoadSpec(store, KEYS, processes=2 if quick else 3, duration=duration, **options)


def restart_empty(quick: bool) -> list[Row]:
    """SCRIPT FLUSH + FLUSHALL under load (NOSCRIPT on the next call), then a fast restart."""
    duration = 3.0 if quick else 6.0
    server = rs.RedisServer()
    try:
        load = Load(_spec(StoreSpec("redis", (server.url,), socket_timeout=_timeout(quick)), quick,
                          duration))  # fmt: skip
        flushes = 3
        for i in range(flushes):
            load.at(0.5 + i * 0.5)
            client = server.client()
            client.script_flush()
            client.flushall()
            client.close()
        flush_end = load.start_at + 0.5 + flushes * 0.5
        load.at(duration * 0.7)
        t_restart = load.start_at + duration * 0.7
        server.restart()
        result = load.join()
    finally:
        server.stop()
    before = result.between(load.start_at, flush_end)
    flushed_degraded = sum(r[3] for r in before)
    recovery = _recovery(result, t_restart)
    return [
        Row(
            f"script cache flushed {flushes}x under load (NOSCRIPT)",
            "NOSCRIPT answered by EVAL in the same call: no degraded answer, nothing raised",
            f"{len(before)} answered, {flushed_degraded} degraded, {len(result.errors)} raised",
            flushed_degraded == 0 and not result.errors and bool(before),
        ),
        Row(
            "primary restarted empty (kill + start) under load",
            "zero failed requests (nothing raised); decisions resume",
            f"{len(result.records)} answered, {len(result.errors)} raised, "
            f"{sum(r[3] for r in result.records)} degraded during the restart, back after "
            + ("never" if recovery is None else f"{recovery:.2f} s"),
            not result.errors and recovery is not None,
        ),
    ]


def failover(quick: bool) -> list[Row]:
    """Kill the primary, promote its replica (REPLICAOF NO ONE), repoint the same-named shard."""
    kill_at, promote_at, duration = (0.8, 1.1, 3.0) if quick else (2.5, 3.0, 7.0)
    primary = rs.RedisServer()
    replica = rs.start_replica(primary)
    try:
        spec = _spec(
            StoreSpec("sharded", (primary.url,), ("shard-1",), _timeout(quick)),
            quick,
            duration,
            failover=StoreSpec("sharded", (replica.url,), ("shard-1",), _timeout(quick)),
        )
        load = Load(spec)
        load.at(kill_at)
        primary.kill()
        load.at(promote_at)
        replica.client().replicaof("NO", "ONE")
        load.repoint.set()
        t_repoint = load.start_at + promote_at
        result = load.join()
        counted = Limiter(StoreSpec("sharded", (replica.url,), ("shard-1",), 5.0).build())
        limit = 1_000_000
        stored = sum(limit - counted.peek(k, spec.rate).remaining for k in KEYS)
    finally:
        replica.stop()
        primary.stop()
    exact_admits = sum(1 for r in result.records if r[2] and not r[3])
    degraded = sum(r[3] for r in result.records)
    # A hit Redis applied and replicated but whose reply was cut by the kill counts as
    # degraded at the client and as stored at the replica: stored may exceed exact admits by
    # at most the degraded answers. Only the other direction is over-admission.
    lost = max(exact_admits - stored, 0)
    unacknowledged = max(stored - exact_admits, 0)
    after = result.between(t_repoint + 0.2, float("inf"))
    return [
        Row(
            "failover: primary SIGKILL, replica promoted (REPLICAOF NO ONE), shard repointed "
            "(same name)",
            "decisions continue on the promoted replica; nothing raised",
            f"{len(after)} decisions after the switch, "
            f"{sum(not r[3] for r in after)} of them exact; {len(result.errors)} raised",
            not result.errors and bool(after) and all(not r[3] for r in after),
        ),
        Row(
            "failover (same run)",
            "over-admission during the switch = fail-open answers + hits the replica never got",
            f"{degraded} fail-open answers in {promote_at - kill_at:.1f} s down; "
            f"{lost} acknowledged hits lost in replication (of {exact_admits}); "
            f"{unacknowledged} applied but unacknowledged",
            unacknowledged <= degraded
            and degraded + lost
            <= len(result.between(load.start_at + kill_at - 0.05, t_repoint + 0.2)),
        ),
    ]


def sentinel_failover(quick: bool) -> list[Row]:
    """Three Sentinels watch a primary and its replica; the primary is SIGKILLed under load and
    the workers' ``SentinelStore``s must follow the promotion on their own (no repointing)."""
    kill_at, duration = (0.8, 9.0) if quick else (2.0, 14.0)
    group = rs.SentinelGroup()
    try:
        # quick: reconnecting asks a Sentinel first, one more round trip to fit in the timeout
        timeout = 2 * QUICK_TIMEOUT if quick else TIMEOUT
        store = StoreSpec("sentinel", tuple(group.urls), (group.service,), timeout)
        spec = _spec(store, quick, duration)
        load = Load(spec)
        old = group.primary()
        load.at(kill_at)
        t_kill = time.monotonic()
        old.kill()
        group.wait_promoted(old.port, timeout=duration)
        t_promoted = time.monotonic()
        result = load.join()
        counted = Limiter(StoreSpec("sentinel", store.urls, store.names, 5.0).build())
        limit = 1_000_000
        stored = sum(limit - counted.peek(k, spec.rate).remaining for k in KEYS)
    finally:
        group.stop()
    exact_admits = sum(1 for r in result.records if r[2] and not r[3])
    degraded = sum(r[3] for r in result.records)
    lost, extra = max(0, exact_admits - stored), max(0, stored - exact_admits)
    recovery = _recovery(result, t_kill)
    relapsed = sum(r[3] for r in result.between(t_kill + (recovery or 0) + 0.1, float("inf")))
    before = result.between(load.start_at, t_kill - 0.2)
    after = result.between(t_kill + (recovery or duration), float("inf"))
    fault = "Sentinel failover: primary SIGKILL, 3 Sentinels promote its replica (SentinelStore)"
    return [
        Row(
            fault,
            "decisions go on after the promotion with no repointing; nothing raised; "
            "fail-open only during the switch",
            f"{len(result.records)} answered, {len(result.errors)} raised; "
            f"{sum(r[3] for r in before)} degraded before the kill, {relapsed} after recovery; "
            f"{len(after)} decisions after recovery, all exact",
            not result.errors
            and not any(r[3] for r in before)
            and recovery is not None
            and relapsed == 0
            and bool(after),
        ),
        Row(
            f"{fault} (same run)",
            "time to recover; over-admission during the switch = fail-open answers + "
            "hits the old primary acknowledged that the replica never got",
            ("never recovered" if recovery is None else f"every key exact again {recovery:.2f} s")
            + f" after the kill (promotion after {t_promoted - t_kill:.2f} s: down-after 1 s "
            f"and the election; the rest is the breaker's cool-down); over-admission: "
            f"{degraded} fail-open answers, {lost} acknowledged hits lost (of {exact_admits}; "
            f"{extra} counted hits were answered fail-open)",
            recovery is not None,
        ),
    ]


def shard_lost(quick: bool) -> list[Row]:
    """Two shards under load on keys that saturate; one shard is SIGKILLed and never returns."""
    kill_at, duration = (0.8, 2.5) if quick else (2.0, 6.0)
    a, b = rs.RedisServer(), rs.RedisServer()
    try:
        limit = 10  # reached within the first second on every key
        store = StoreSpec("sharded", (a.url, b.url), ("a", "b"), _timeout(quick))
        owner = store.build()
        on_a = {i for i, k in enumerate(KEYS) if owner.shard_of(k).name == "a"}
        owner.close()
        spec = _spec(store, quick, duration, rate=f"{limit}/day")
        load = Load(spec)
        load.at(kill_at)
        b.kill()
        t_kill = load.start_at + kill_at
        result = load.join()
    finally:
        a.stop()
        b.stop()
    admitted = [0] * len(KEYS)
    a_degraded = 0
    b_degraded_after = 0
    for start, _lat, allowed, degraded, k in result.records:
        admitted[k] += allowed and not degraded
        if k in on_a:
            a_degraded += degraded
        elif start >= t_kill + 0.1:
            b_degraded_after += degraded
    exact_a = sum(admitted[k] == limit for k in on_a)
    after_a = sum(1 for r in result.records if r[4] in on_a and r[0] >= t_kill)
    return [
        Row(
            "a shard of a ShardedRedisStore SIGKILLed for good (2 shards)",
            "only its keys degrade; every key of the other shard admits exactly its limit",
            f"{exact_a}/{len(on_a)} surviving keys admitted exactly {limit} "
            f"({after_a} decisions on them after the kill, {a_degraded} degraded); "
            f"lost shard: {b_degraded_after} fail-open answers",
            exact_a == len(on_a)
            and a_degraded == 0
            and after_a > 0
            and b_degraded_after > 0
            and not result.errors,
        ),
    ]


def stale_replica() -> list[Row]:
    """A replica cut off from its primary still holds full, ended state: peeks never reject."""
    from ratekeeper.algorithms import ALGORITHMS

    primary = rs.RedisServer()
    replica = rs.start_replica(primary)
    false_rejections = 0
    peeks = 0
    try:
        clock = ManualClock()
        store = ShardedRedisStore([Shard(primary.url, replicas=[replica.url])], socket_timeout=1)
        limiter = Limiter(store, clock=clock, fail_open=False)
        for algorithm in sorted(ALGORITHMS):
            while limiter.hit(f"k-{algorithm}", "3/minute", algorithm=algorithm).allowed:
                pass
        rs.wait_replicated(primary)
        replica.client().replicaof("127.0.0.1", rs.free_port())  # stale from now on
        clock.advance(121)
        held = len(replica.client().keys("rk*"))
        for algorithm in sorted(ALGORITHMS):
            for _ in range(10):
                peeks += 1
                false_rejections += not limiter.peek(
                    f"k-{algorithm}", "3/minute", algorithm=algorithm
                ).allowed
        store.close()
    finally:
        replica.stop()
        primary.stop()
    return [
        Row(
            "replica cut off from its primary, holding full ended windows (every algorithm)",
            "no false rejection from a peek served by the stale replica (GitHub's bug 2)",
            f"{false_rejections} rejections in {peeks} peeks; replica held {held} ended keys",
            false_rejections == 0 and held > 0,
        )
    ]


def clock_skew(seeds: int) -> list[Row]:
    """Two limiters 2 s apart share keys on Redis: bound per algorithm, and reset_at wobble."""
    from ratekeeper import RedisStore
    from tests.conftest import Backend
    from tests.test_clock_skew import ALGORITHMS, SKEW, L, P, most_in_any, run

    server = rs.RedisServer()
    rows = []
    try:
        client = server.client()
        backend = Backend("redis", lambda: RedisStore(server.url, socket_timeout=5),
                          lambda: client.flushall() and None)  # fmt: skip
        for algorithm in ALGORITHMS:
            worst, wobbles, bound_txt = 0.0, 0, ""
            for seed in range(seeds):
                backend.flush()
                events = run(backend, algorithm, seed)
                times = [e.true for e in events if e.allowed]
                worst = max(worst, _skew_ratio(algorithm, events, times, L, P, SKEW, most_in_any))
                resets = [e.reset_at for e in events]
                if algorithm in ("fixed_window", "token_bucket", "gcra"):
                    wobbles += sum(b < a for a, b in itertools.pairwise(resets))
            bound_txt = _BOUNDS[algorithm]
            rows.append(
                Row(
                    f"clock skew ±{SKEW:.0f} s between two limiters, {algorithm} (Redis)",
                    f"admissions within the documented bound ({bound_txt}); no reset wobble",
                    f"worst {worst:.0%} of the bound over {seeds} random runs; "
                    f"{wobbles} decreases of reset_at (X-RateLimit-Reset is its ceiling)",
                    worst <= 1.0 and wobbles == 0,
                )
            )
    finally:
        server.stop()
    return rows


_BOUNDS = {
    "fixed_window": "≤ L per window, windows ≥ P - s apart",
    "token_bucket": "≤ burst + L·(D + s)/P in any D",
    "gcra": "≤ burst + L·(D + s)/P in any D",
    "sliding_log": "≤ L in any P - s",
    "sliding_window": "≤ L in [kP, (k+1)P - s)",
}


def _skew_ratio(
    algorithm: str, events: list, times: list[float], L: int, P: float, s: float,
    most_in_any: Callable[[list[float], float], int],
) -> float:  # fmt: skip
    """The worst observed count divided by its bound (≤ 1 passes)."""
    if algorithm == "fixed_window":  # per window at most L; windows open >= P - s apart
        windows: dict[float, list[float]] = {}
        for e in events:
            if e.allowed:
                windows.setdefault(e.reset_at, []).append(e.true)
        opened = sorted(ts[0] for ts in windows.values())
        gap = min((b - a for a, b in itertools.pairwise(opened)), default=P)
        return max(max(len(ts) for ts in windows.values()) / L, (P - s) / max(gap, 1e-9))
    if algorithm in ("token_bucket", "gcra"):
        worst = 0.0
        for i, t_i in enumerate(times):
            for j in range(i, len(times)):
                worst = max(worst, (j - i + 1) / (L + L * (times[j] - t_i + s) / P))
        return worst
    if algorithm == "sliding_log":
        return most_in_any(times, P - s) / L
    return max(sum(k * P <= t < (k + 1) * P - s for t in times) for k in range(7)) / L


__all__ = [
    "clock_skew",
    "failover",
    "outage",
    "restart_empty",
    "sentinel_failover",
    "shard_lost",
    "stale_replica",
]
