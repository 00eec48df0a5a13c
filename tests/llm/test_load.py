"""Four gateway processes on one Redis, 16 concurrent streaming clients per key, against an
upstream streaming real-format SSE: per aligned window, the tokens each level admitted stay
within its limit plus its debt, requests within their limit, and the provider's figures are
what is charged; clients that drop after the first chunks are charged what the upstream
reported. Bounded: a few seconds of load each."""

from __future__ import annotations

import asyncio
import collections
import glob
import json
import math
import random
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.llm.procs import Served, gateway_env

P = 2.0  # the windows' length (s): short, so a few seconds see several
KEYS = {
    "k1": ("acme", "red"),
    "k2": ("acme", "red"),
    "k3": ("acme", "blue"),
    "k4": ("acme", "blue"),
}
LIMITS = [
    ["org", "6000/2s", "tokens"],
    ["team", "4000/2s", "tokens"],
    ["key", "2500/2s", "tokens"],
    ["key", "30/2s", "requests"],
]
DEBT = {"org-tokens": 600, "team-tokens": 400, "key-tokens": 250}  # a tenth: the default
LIGHT = {"k1", "k2"}  # short answers: their requests limit binds; k3, k4's tokens do
CLIENTS = 16


def _body(key: str) -> dict[str, Any]:
    most = 10 if key in LIGHT else 80
    return {
        "model": "m",
        "max_tokens": most,
        "stream": True,
        "messages": [{"role": "user", "content": "tell me a story " * 3}],
    }


@pytest.fixture
def fleet(redis_url: str, tmp_path: Path) -> Iterator[tuple[Served, list[Served], str, Any]]:
    up = Served("tests.llm.fake_upstream:app")
    log = str(tmp_path / "reservations")
    made: list[Served] = []

    def start(**extra: Any) -> list[Served]:
        config = {
            "redis": redis_url,
            "upstream": up.url,
            "log": log,
            "limits": LIMITS,
            "callers": KEYS,
            **extra,
        }
        for _ in range(4):
            made.append(Served("tests.llm.gateway_proc:make", gateway_env(config), factory=True))
        return made[-4:]

    try:
        yield up, made, log, start
    finally:
        for proc in [*made, up]:
            proc.stop()


async def _client(
    urls: list[str],
    key: str,
    n: int,
    until: float,
    chunks: int | None,
    http: httpx.AsyncClient,
    stats: collections.Counter[str],
) -> None:
    rng = random.Random(f"{key}{n}")
    i = n
    while time.monotonic() < until:
        i += 1
        headers = {
            "authorization": f"Bearer {key}",
            "x-fake-key": key,
            "x-fake-output": str(rng.randint(1, 100)),
            "x-fake-delay": "0.002",
        }
        if rng.random() < 0.1:  # a prompt that tokenizes worse than the estimate guessed
            headers["x-fake-prompt"] = "60"
        url = urls[i % len(urls)] + "/v1/chat/completions"
        try:
            async with http.stream("POST", url, json=_body(key), headers=headers) as r:
                stats[f"{key}:{r.status_code}"] += 1
                if r.status_code == 429:
                    wait = int(r.headers.get("retry-after-ms", "200")) / 1000
                    await asyncio.sleep(min(wait, 0.5) * rng.uniform(0.5, 1.0))
                    continue
                got = 0
                async for _ in r.aiter_raw():
                    got += 1
                    if chunks is not None and got >= chunks:
                        break  # the client leaves early
        except httpx.HTTPError as exc:
            stats[f"error:{type(exc).__name__}"] += 1


async def _load(
    urls: list[str], seconds: float, chunks: int | None = None
) -> collections.Counter[str]:
    stats: collections.Counter[str] = collections.Counter()
    limits = httpx.Limits(max_connections=len(KEYS) * CLIENTS * 2)
    async with httpx.AsyncClient(timeout=30, limits=limits) as http:
        until = time.monotonic() + seconds
        await asyncio.gather(
            *(
                _client(urls, key, n, until, chunks, http, stats)
                for key in KEYS
                for n in range(CLIENTS)
            )
        )
    return stats


def _entries(log: str, timeout: float = 30.0) -> tuple[dict[str, Any], dict[str, Any]]:
    """Every process's reservations and their ends, once each admitted one has ended."""
    deadline = time.monotonic() + timeout
    while True:
        reserves: dict[str, Any] = {}
        ends: dict[str, Any] = {}
        for path in glob.glob(log + ".*"):
            for line in Path(path).read_text().splitlines():
                e = json.loads(line)
                (reserves if e["op"] == "reserve" else ends)[e["id"]] = e
        open_ = [i for i, r in reserves.items() if r["allowed"] and i not in ends]
        if not open_ or time.monotonic() > deadline:
            assert not open_, f"{len(open_)} reservations never ended"
            return reserves, ends
        time.sleep(0.2)


def _window(t: float) -> int:
    return math.floor(round(t * 1000) / (P * 1000))


def test_four_gateways_hold_every_level(fleet: Any) -> None:
    up, _, log, start = fleet
    urls = [g.url for g in start()]
    stats = asyncio.run(_load(urls, 8.0))
    reserves, ends = _entries(log)
    assert not [k for k in stats if k.startswith("error")], stats
    assert not any(r["degraded"] for r in reserves.values())
    # what the gateways charged is what the upstream reported, per key
    upstream = httpx.get(up.url + "/_log", timeout=20).json()["log"]
    for key in KEYS:
        billed = sum(e["total"] for e in upstream if e["key"] == key)
        charged = sum(
            ends[i]["actual"] for i, r in reserves.items() if r["allowed"] and r["keys"][-1] == key
        )
        assert charged == billed > 0, key
        admitted = sum(1 for r in reserves.values() if r["allowed"] and r["keys"][-1] == key)
        assert admitted == stats[f"{key}:200"] == sum(1 for e in upstream if e["key"] == key)
    # each level's counter, rebuilt per window with fixed_window's settle rules
    tokens: dict[tuple[str, str, int], int] = collections.defaultdict(int)
    requests: dict[tuple[str, int], int] = collections.defaultdict(int)
    for rid, r in reserves.items():
        if not r["allowed"]:
            continue
        w0, end = _window(r["at"]), ends[rid]
        w1, actual = _window(end["at"]), end["actual"]
        org, team, key = r["keys"][0], r["keys"][1], r["keys"][2]
        requests[(key, w0)] += 1
        for level, who in (("org-tokens", org), ("team-tokens", team), ("key-tokens", key)):
            tokens[(level, who, w0)] += r["estimate"]
            if actual < r["estimate"] and w1 == w0:
                tokens[(level, who, w0)] -= r["estimate"] - actual  # given back in its window
            elif actual > r["estimate"]:
                tokens[(level, who, w1)] += actual - r["estimate"]  # an extra: the live window
    limit = {"org-tokens": 6000, "team-tokens": 4000, "key-tokens": 2500}
    peak: dict[str, int] = collections.defaultdict(int)
    for (level, who, _), n in tokens.items():
        assert n <= limit[level] + DEBT[level], (level, who, n)
        peak[f"{level}:{who}"] = max(peak[f"{level}:{who}"], n)
    for (key, _), n in requests.items():
        assert n <= 30, (key, n)
    # and the limits did bind: the load asked for more than they allow
    assert sum(v for k, v in stats.items() if k.endswith(":429")) > 0
    best = max(n for (k, _), n in requests.items() if k in LIGHT)
    assert best == 30  # exact: a light key's window filled to its request limit, not past it
    print(
        "peaks",
        dict(peak),
        "requests",
        {k: max(n for (kk, _), n in requests.items() if kk == k) for k in KEYS},
        dict(stats),
    )


def test_clients_that_drop_early_are_charged_what_the_upstream_reported(fleet: Any) -> None:
    up, _, log, start = fleet
    room = [["org", "100000000/hour", "tokens"], ["key", "100000000/hour", "tokens"]]
    urls = [g.url for g in start(limits=room)]
    stats = asyncio.run(_load(urls, 5.0, chunks=3))
    _reserves, ends = _entries(log)
    upstream = httpx.get(up.url + "/_log", timeout=20).json()["log"]
    billed = sum(e["total"] for e in upstream)
    charged = sum(e.get("actual", 0) for e in ends.values())
    assert billed > 0 and len(upstream) == sum(v for k, v in stats.items() if k.endswith(":200"))
    assert charged >= 0.99 * billed, (charged, billed)
    print(
        "early disconnects: charged", charged, "of", billed, "reported,", len(upstream), "streams"
    )
