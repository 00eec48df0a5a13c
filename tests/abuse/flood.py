"""Redis calls per request when one client floods one key, against a normal request.

Counted by Redis itself (``INFO commandstats``, minus the measurement's own ``INFO`` and
``CONFIG``): ``scripts`` are the script calls the client sends (``EVALSHA``/``EVAL``, one per
decision), ``commands`` every command Redis ran, the ones inside scripts included (a flood
request's script only reads). On a real redis-server, through the library
(``Limiter`` on ``RedisStore``) and through a real ``ratekeeper serve`` process (whose
over-limit cache answers a flooding key locally until the store's ``retry_after``). The
policy is GCRA at 5/hour in both: no window boundary can fall inside a run that uses the
wall clock, and a rejection's ``retry_after`` (12 minutes) outlasts the flood.

``python -m tests.abuse.flood`` prints the figures (used by ``scripts/fuzz``).
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from pathlib import Path

import httpx
import redis

from ratekeeper import Limiter, ManualClock, RedisStore


@dataclass(frozen=True, slots=True)
class Cost:
    """Per request, over ``requests``: script calls, all commands, Redis CPU microseconds."""

    requests: int
    scripts: float
    commands: float
    usec: float


def redis_totals(url: str) -> tuple[int, int, int]:
    """(script calls, commands, usec) so far, without the measurement's INFO and CONFIG."""
    client = redis.Redis.from_url(url)
    try:
        stats = client.info("commandstats")
    finally:
        client.close()
    scripts = commands = usec = 0
    for name, row in stats.items():
        command = name.removeprefix("cmdstat_")
        if command in ("info", "config|resetstat", "config"):
            continue
        commands, usec = commands + int(row["calls"]), usec + int(row["usec"])
        if command.startswith("eval"):
            scripts += int(row["calls"])
    return scripts, commands, usec


def reset_stats(url: str) -> None:
    client = redis.Redis.from_url(url)
    try:
        client.config_resetstat()
    finally:
        client.close()


def _per_request(url: str, before: tuple[int, int, int], requests: int) -> Cost:
    after = redis_totals(url)
    return Cost(requests, *((a - b) / requests for a, b in zip(after, before, strict=True)))


def library_costs(url: str, requests: int = 300, rate: str = "5/hour") -> tuple[Cost, Cost]:
    """(normal, flood) through ``Limiter`` + ``RedisStore``: distinct keys, then one key."""
    store = RedisStore(url, prefix="flood-lib", socket_timeout=5)
    limiter = Limiter(store=store, clock=ManualClock(start=1_699_999_200.0))
    try:
        limiter.hit(
            "warm-up", rate, algorithm="gcra"
        )  # script load and connection set-up are not a request's
        before = redis_totals(url)
        assert all(
            limiter.hit(f"normal-{i}", rate, algorithm="gcra").allowed for i in range(requests)
        )
        normal = _per_request(url, before, requests)
        before = redis_totals(url)
        answers = [limiter.hit("flooder", rate, algorithm="gcra").allowed for _ in range(requests)]
        flood = _per_request(url, before, requests)
    finally:
        store.close()
    assert sum(answers) == int(rate.split("/")[0]), "the flood was not limited"
    return normal, flood


def service_config(url: str, local_cache: bool = True) -> str:
    """The service's config: Redis' replies get 5 s, not the default 50 ms, so that a loaded
    machine's slow reply is not a store error (which the limiter would answer without Redis,
    failing open, and so change the counts and the flood's decisions)."""
    return f"""\
store:
  url: {url}
  prefix: flood-svc
  socket_timeout: 5
limits:
  local_cache: {"true" if local_cache else "false"}
policies:
  p:
    rate: 5/hour
    algorithm: gcra
"""


def service_costs(url: str, base: str, requests: int = 300) -> tuple[Cost, Cost]:
    """(normal, flood) through a running service at ``base`` whose store is Redis at ``url``."""
    with httpx.Client(base_url=base, timeout=10) as http:

        def hit(key: str) -> bool:
            response = http.post("/v1/hit", json={"policy": "p", "key": key})
            response.raise_for_status()
            return bool(response.json()["allowed"])

        hit("warm-up")
        before = redis_totals(url)
        assert all(hit(f"normal-{i}") for i in range(requests))
        normal = _per_request(url, before, requests)
        before = redis_totals(url)
        answers = [hit("flooder") for _ in range(requests)]
        flood = _per_request(url, before, requests)
    assert sum(answers) == 5, "the flood was not limited"
    return normal, flood


def main() -> int:
    """Start a redis-server and services, print the figures as Markdown table rows."""
    from tests.redis_servers import RedisServer
    from tests.service.proc import ServiceProcess

    server = RedisServer()
    server.start()
    server.wait_ready()
    try:
        rows = [("library (Limiter + RedisStore)", *library_costs(server.url))]
        for cache in (True, False):
            path = Path(f"/tmp/ratekeeper-flood-{server.port}-{cache}.yaml")
            path.write_text(service_config(server.url, cache))
            proc = ServiceProcess(path, grpc=False)
            try:
                server.client().flushall()
                label = "service, local_cache " + ("on" if cache else "off")
                rows.append((label, *service_costs(server.url, proc.url)))
            finally:
                proc.stop()
                path.unlink()
    finally:
        server.stop()
    print("| path | script calls / normal | / flood | commands / normal | / flood |"
          " Redis usec / normal | / flood |")  # fmt: skip
    print("| --- | --- | --- | --- | --- | --- | --- |")
    for label, n, f in rows:
        print(
            f"| {label} | {n.scripts:.3f} | {f.scripts:.3f} | {n.commands:.3f} "
            f"| {f.commands:.3f} | {n.usec:.1f} | {f.usec:.1f} |"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
