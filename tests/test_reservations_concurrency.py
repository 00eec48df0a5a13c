"""Reserve and settle from 16 threads in 4 processes on one real Redis.

- Exact: with room to spare, every counter ends at exactly the sum of the actual costs
  settled on it (cancels count nothing), whatever the interleaving: no settle lost, none
  counted twice.
- Bounded: on tight limits with small debts and extras far past them, a watcher reading the
  counters' stored values all along never sees one past its limit plus its debt.
"""

from __future__ import annotations

import multiprocessing
import queue
import random
import threading
import time
from typing import Any

import redis

from ratekeeper import Limiter, RedisStore
from ratekeeper.nested import Level

PROCESSES, THREADS, ROUNDS = 4, 4, 40
USERS = ["user:1", "user:2", "user:3"]


def levels(user: str, tight: bool) -> list[Level]:
    if tight:
        return [Level("org", "200/hour", debt=50), Level(user, "60/hour", "sliding_log", debt=20)]
    return [Level("org", "10000000/hour"), Level(user, "100000/hour", "sliding_log")]


def worker(url: str, seed: int, tight: bool, out: Any) -> None:
    """One process: THREADS threads, each reserving and settling ROUNDS times."""
    store = RedisStore(url, socket_timeout=10)
    limiter = Limiter(store, fail_open=False)
    totals: dict[str, int] = dict.fromkeys(USERS, 0)
    lock = threading.Lock()

    def run(thread_seed: int) -> None:
        rnd = random.Random(thread_seed)
        for _ in range(ROUNDS):
            user = rnd.choice(USERS)
            r = limiter.reserve(levels(user, tight), rnd.randint(0, 8), ttl=60)
            if not r.allowed:
                continue
            if rnd.random() < 0.15:
                assert limiter.cancel(r).status == "settled"
                continue
            actual = rnd.randint(0, 30)
            assert limiter.settle(r, actual).status == "settled"
            with lock:
                totals[user] += actual

    threads = [threading.Thread(target=run, args=(seed * 100 + i,)) for i in range(THREADS)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    store.close()
    out.put(totals)


def run_processes(url: str, tight: bool) -> list[dict[str, int]]:
    ctx = multiprocessing.get_context("spawn")
    out = ctx.Queue()
    procs = [ctx.Process(target=worker, args=(url, i, tight, out)) for i in range(PROCESSES)]
    for p in procs:
        p.start()
    results: list[dict[str, int]] = []
    deadline = time.monotonic() + 300
    while len(results) < len(procs):
        assert time.monotonic() < deadline, "the workers took too long"
        try:
            results.append(out.get(timeout=1))
        except queue.Empty:
            dead = [p.exitcode for p in procs if p.exitcode not in (None, 0)]
            assert not dead, f"a worker failed: exit codes {dead}"
    for p in procs:
        p.join(timeout=60)
        assert p.exitcode == 0
    return results


def test_counts_are_exact_after_every_settle(redis_url: str) -> None:
    results = run_processes(redis_url, tight=False)
    total = {user: sum(r[user] for r in results) for user in USERS}
    limiter = Limiter(RedisStore(redis_url, socket_timeout=5), fail_open=False)
    for user in USERS:
        probe = [Level(**vars_of(lv), cost=0) for lv in levels(user, False)]
        look = limiter.nested(probe, cost=0)
        used = [d.limit - d.remaining for d in look.levels]
        assert used[1] == total[user]
    look = limiter.nested([Level("org", "10000000/hour", cost=0)], cost=0)
    assert look.levels[0].limit - look.remaining == sum(total.values()) > 0


def vars_of(level: Level) -> dict[str, Any]:
    """A level's fields but its cost."""
    return {
        "key": level.key,
        "rate": level.rate,
        "algorithm": level.algorithm,
        "debt": level.debt,
    }


def test_usage_never_passes_the_limit_plus_the_debt(redis_url: str) -> None:
    client = redis.Redis.from_url(redis_url)
    peaks: dict[str, int] = {}
    done = threading.Event()

    def watch() -> None:
        while not done.is_set():
            for key in client.scan_iter(match="rk{*"):
                name = key.decode()
                if name.endswith("f:1h"):  # the org's window: "<count><13-digit end>"
                    raw = client.get(key)
                    used = 0 if raw is None else int(raw) // 10**13
                elif name.endswith("l:1h"):  # a user's log: one entry per unit
                    used = client.llen(key)
                else:
                    continue
                peaks[name] = max(peaks.get(name, 0), used)
            time.sleep(0.001)

    watcher = threading.Thread(target=watch)
    watcher.start()
    try:
        run_processes(redis_url, tight=True)
        # and one extra far past everything, so the debt is surely reached at the end
        limiter = Limiter(RedisStore(redis_url, socket_timeout=5), fail_open=False)
        r = limiter.reserve(levels("user:fresh", True), 0)  # admitted unless org is over
        if r.allowed:
            limiter.settle(r, 10_000)
        time.sleep(0.05)
    finally:
        done.set()
        watcher.join()
    org = [v for k, v in peaks.items() if k.endswith("f:1h")]
    users = [v for k, v in peaks.items() if k.endswith("l:1h")]
    assert org and len(users) >= 3
    assert max(org) <= 200 + 50 and max(users) <= 60 + 20
    final = int(client.get("rk{org}f:1h") or 0) // 10**13
    assert 200 < final <= 250  # in debt, within the bound
    client.close()
