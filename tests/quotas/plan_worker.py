"""One app process of the multi-process plan tests: a limiter on a shared Redis store with plans
from a ``RedisSource``, driven line by line on stdin, answering one JSON line each.

    hit KEY LIMIT N     -> {"admitted": a}      N hits, how many were admitted
    tick SECONDS        -> {"now": t}           both clocks move on (the rate clock and the
                                                plan cache's monotonic one)
    status KEY          -> {"rows": [...]}
    quit

``python -m tests.quotas.plan_worker SOURCE_URL KIND URL [URL...]``: the plans' Redis, and the
counters' store (KIND: redis, sharded, cluster).
"""

from __future__ import annotations

import json
import sys
from typing import Any

from ratekeeper import (
    Limiter,
    ManualClock,
    RedisClusterStore,
    RedisStore,
    Shard,
    ShardedRedisStore,
)
from ratekeeper.quotas import Plans, Quotas, RedisSource

PLANS = """\
default: free
plans:
  free: {api: 20/hour, exports: 5/calendar-month}
  pro: {api: 100/hour, exports: 50/calendar-month}
"""
START = 1_710_000_000.0


def store(kind: str, urls: list[str]) -> Any:
    if kind == "redis":
        return RedisStore(urls[0], socket_timeout=5)
    if kind == "sharded":
        return ShardedRedisStore([Shard(u) for u in urls], socket_timeout=5)
    return RedisClusterStore(urls[0], socket_timeout=5)


def main() -> None:
    source_url, kind, *urls = sys.argv[1:]
    clock = ManualClock(START)
    mono = ManualClock(1000.0)
    source = RedisSource(source_url, socket_timeout=5)
    quotas = Quotas(Plans.from_yaml(PLANS), source, ttl=30, monotonic=mono)
    limiter = Limiter(store(kind, urls), clock=clock, fail_open=False, quotas=quotas)
    print(json.dumps({"ready": True}), flush=True)
    for line in sys.stdin:
        words = line.split()
        if not words or words[0] == "quit":
            break
        if words[0] == "hit":
            key, limit, n = words[1], words[2], int(words[3])
            admitted = sum(limiter.hit(key, f"plan:{limit}").allowed for _ in range(n))
            answer: dict[str, Any] = {"admitted": admitted}
        elif words[0] == "tick":
            clock.advance(float(words[1]))
            mono.advance(float(words[1]))
            answer = {"now": clock()}
        else:
            answer = {"rows": [r.to_dict() for r in limiter.status(words[1])]}
        print(json.dumps(answer), flush=True)
    quotas.close()


if __name__ == "__main__":
    main()
