"""Four app processes on one Redis store and one plan source: a plan change mid-period keeps the
counts and applies everywhere within the cache's TTL, or at once when published."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from collections.abc import Iterator
from typing import Any

import pytest
import redis

from ratekeeper.quotas import RedisSource
from tests.conftest import REDIS_STORES

ROOT = __file__.rsplit("/tests/", 1)[0]


class Worker:
    """One ``plan_worker`` process."""

    def __init__(self, argv: list[str]) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "tests.quotas.plan_worker", *argv],
            cwd=ROOT,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        assert self.read() == {"ready": True}

    def read(self) -> Any:
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline()
        assert line, "the worker exited"
        return json.loads(line)

    def ask(self, command: str) -> Any:
        assert self.proc.stdin is not None
        self.proc.stdin.write(command + "\n")
        self.proc.stdin.flush()
        return self.read()

    def stop(self) -> None:
        if self.proc.poll() is None:
            assert self.proc.stdin is not None
            self.proc.stdin.close()
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


@pytest.fixture(params=REDIS_STORES)
def workers(request: pytest.FixtureRequest, redis_url: str) -> Iterator[list[Worker]]:
    kind = request.param
    if kind == "redis":
        urls = [request.getfixturevalue("shard_urls")[0]]
        for u in urls:
            redis.Redis.from_url(u).flushall()
    elif kind == "sharded":
        urls = request.getfixturevalue("shard_urls")
    else:
        urls = [request.getfixturevalue("cluster_url")]
    started: list[Worker] = []
    try:
        for _ in range(4):
            started.append(Worker([redis_url, kind, *urls]))
        yield started
    finally:
        for w in started:
            w.stop()


def hits(workers: list[Worker], key: str, limit: str, n: int) -> int:
    return sum(w.ask(f"hit {key} {limit} {n}")["admitted"] for w in workers)


def test_a_plan_change_keeps_counts_and_applies_within_the_ttl(
    workers: list[Worker], redis_url: str
) -> None:
    client = redis.Redis.from_url(redis_url)
    source = RedisSource(client=client)
    assert hits(workers, "acme", "api", 8) == 20  # free: 20/hour across the four processes
    # the plan changes in the database, and nobody is told: each cache has it for its TTL
    client.hset(source.key("acme"), "plan", "pro")
    for w in workers:
        w.ask("tick 29")
    assert hits(workers, "acme", "api", 2) == 0
    for w in workers:
        w.ask("tick 1")  # 30 s: every process asks again; the 20 used still count
    assert hits(workers, "acme", "api", 30) == 80
    rows = workers[0].ask("status acme")["rows"]
    api = next(r for r in rows if r["name"] == "api")
    assert (api["plan"], api["limit"], api["used"], api["remaining"]) == ("pro", 100, 100, 0)
    # a change through the source is published: every process drops it at once, no tick
    source.set_plan("acme", "free")
    deadline = time.monotonic() + 20
    while not all(
        w.ask("status acme")["rows"][0]["plan"] == "free" for w in workers
    ):  # the listeners run in their own threads: wait for all four, bounded
        assert time.monotonic() < deadline, "a process did not hear of the change"
        time.sleep(0.05)
    assert hits(workers, "acme", "api", 1) == 0  # 100 used of 20: refused until the hour ends
    for w in workers:
        w.ask("tick 3600")
    assert hits(workers, "acme", "api", 6) == 20
