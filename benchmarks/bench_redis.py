"""Redis benchmarks: ratekeeper's RedisStore against a raw EVALSHA loop and against the peers.

Run: ``.venv/bin/python -m benchmarks.bench_redis [--quick] [--only a,b,c,d]`` (needs
``redis-server``, ``taskset`` and the ``bench`` extra). Every Redis it uses is started here on a
free 127.0.0.1 port and stopped by PID; nothing else is touched. Bounded: the full run sends
about 1.5 million commands and takes a few minutes on 2 vCPUs.

- (a) single-thread sync ``Limiter.hit`` on ``RedisStore`` vs a raw redis-py + hiredis
  ``EVALSHA`` loop of the same script and arguments, unpinned and with client and redis-server
  pinned to CPU 0 (``taskset -c 0``), best of three rounds each;
- (b) the same algorithm in ``limits``, ``throttled-py`` and ``pyrate-limiter`` on the same
  Redis, in ``--rounds`` interleaved rounds (median, and the range of the ratio to ours):
  decisions/s, Redis CPU per decision (``INFO cpu`` user+sys delta, which includes the
  server's network I/O) and script time per decision (``INFO commandstats`` usec of the EVAL
  family, which includes the commands a script runs, plus plain commands for clients that send
  them);
- (c) Redis memory per key: ``used_memory`` delta over N keys with one hit each;
  sliding_log per admitted entry;
- (d) sliding_window vs sliding_log at 10, 1,000 and 10,000 requests per window;
- (e) the compact key layout (``CompactLayout``) against the default one: ``used_memory`` per
  key over N keys (fresh servers), and script time per decision (``INFO commandstats`` usec of
  ``EVALSHA``) of hits on random live keys, both layouts in interleaved rounds on one server.

Figures are noisy: the machine is shared; compare ratios within one run, not across runs.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import tempfile
import time
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from typing import Any

import redis

from ratekeeper import Limiter, ManualClock, RedisStore
from ratekeeper.stores.redis.codec import Codec, fallback, script
from ratekeeper.stores.redis.layout import CompactLayout
from tests.redis_servers import free_port

ALGORITHMS = ["fixed_window", "token_bucket", "gcra", "sliding_window", "sliding_log"]
# One hit must keep a key alive for the whole fill (a 1000/minute bucket is full again, and its
# key gone, 60 ms after one hit), so memory is measured at 10/hour.
MEMORY_RATE = "10/hour"


# ---------------------------------------------------------------- servers and measurement


@contextmanager
def redis_server(pinned: bool) -> Iterator[redis.Redis]:
    """A throwaway redis-server (on CPU 0 when ``pinned``), stopped by PID afterwards."""
    port = free_port()
    workdir = tempfile.mkdtemp(prefix="rk-bench-")
    args = ["redis-server", "--port", str(port), "--bind", "127.0.0.1", "--save", "",
            "--appendonly", "no", "--dir", workdir, "--loglevel", "warning"]  # fmt: skip
    if pinned:
        args = ["taskset", "-c", "0", *args]
    proc = subprocess.Popen(args, stdout=subprocess.DEVNULL)
    client = redis.Redis(port=port)
    try:
        for _ in range(200):
            try:
                client.ping()
                break
            except redis.ConnectionError:
                time.sleep(0.02)
        yield client
    finally:
        client.close()
        proc.terminate()
        proc.wait(10)
        shutil.rmtree(workdir, ignore_errors=True)


@contextmanager
def pinned_client(pinned: bool) -> Iterator[None]:
    """Run this process on CPU 0 only, when ``pinned``."""
    before = os.sched_getaffinity(0)
    if pinned:
        os.sched_setaffinity(0, {0})
    try:
        yield
    finally:
        os.sched_setaffinity(0, before)


def url(client: redis.Redis) -> str:
    return f"redis://127.0.0.1:{client.connection_pool.connection_kwargs['port']}/0"


def server_usage(client: redis.Redis) -> tuple[float, float, str]:
    """(CPU seconds of the server, usec it spent in top-level commands).

    Commands a script runs are counted in ``commandstats`` twice (on their own and inside the
    EVAL's usec), so for clients that use scripts only the EVAL family counts; for clients that
    send no script at all every command counts.
    """
    cpu = client.info("cpu")
    stats = {k.split("_", 1)[1]: v for k, v in client.info("commandstats").items()}
    evals = [v for k, v in stats.items() if k in ("evalsha", "evalsha_ro", "eval", "eval_ro")]
    usec = (
        sum(v["usec"] for v in evals)
        if evals
        else sum(v["usec"] for k, v in stats.items() if k not in ("info", "config|resetstat"))
    )
    calls = sorted(stats, key=lambda k: -stats[k]["calls"])
    shape = "+".join(k.upper() for k in calls if k not in ("info", "config|resetstat"))[:40]
    return cpu["used_cpu_user"] + cpu["used_cpu_sys"], usec, shape


def measure(client: redis.Redis, n: int, run: Callable[[int], Any]) -> dict[str, Any]:
    """Run ``run(i)`` for i < n; decisions/s and the server's cost per decision."""
    client.config_resetstat()
    cpu0, _, _ = server_usage(client)
    start = time.perf_counter()
    for i in range(n):
        run(i)
    elapsed = time.perf_counter() - start
    cpu1, usec, shape = server_usage(client)
    return {
        "rate": n / elapsed,
        "cpu_us": (cpu1 - cpu0) * 1e6 / n,
        "cmd_us": usec / n,
        "shape": shape,
    }


def table(title: str, header: list[str], rows: list[list[str]]) -> None:
    widths = [max(len(r[i]) for r in [header, *rows]) for i in range(len(header))]
    print(f"\n{title}")
    for r in [header, ["-" * w for w in widths], *rows]:
        print(
            "  ".join(
                c.ljust(w) if i == 0 else c.rjust(w)
                for i, (c, w) in enumerate(zip(r, widths, strict=True))
            )
        )


# ---------------------------------------------------------------- contenders


def ours(client: redis.Redis, algorithm: str, rate: str, keys: int) -> Callable[[int], Any]:
    limiter = Limiter(RedisStore(url(client), socket_timeout=1), fail_open=False)
    names = [f"user:{i}" for i in range(keys)]
    hit = limiter.hit
    return lambda i: hit(names[i % keys], rate, algorithm=algorithm)


def raw_evalsha(client: redis.Redis, algorithm: str, rate: str, keys: int) -> Callable[[int], Any]:
    """The ceiling: redis-py + hiredis sending the same EVALSHA, nothing else."""
    limiter = Limiter(RedisStore(client=client), fail_open=False)
    plan = limiter._core.plan("hit", "user:0", rate, algorithm, 1, None, None)
    command = Codec().command(plan)
    sha, tail = command[1], command[4:]
    client.script_load(script(algorithm).source)
    redis_keys = [
        Codec().command(limiter._core.plan("hit", f"user:{i}", rate, algorithm, 1, None, None))[3]
        for i in range(keys)
    ]
    raw = redis.Redis(port=client.connection_pool.connection_kwargs["port"])
    run: Callable[..., Any] = raw.execute_command
    now = time.time
    op, cost, args = tail[0], tail[2], tail[3:]
    assert op == "hit"
    return lambda i: run(
        "EVALSHA", sha, 1, redis_keys[i % keys], op, int(now() * 1000), cost, *args
    )


def limits_peer(
    client: redis.Redis, algorithm: str, rate: str, keys: int
) -> Callable[[int], Any] | None:
    from limits import parse, storage, strategies

    cls: type[strategies.RateLimiter] | None = {
        "fixed_window": strategies.FixedWindowRateLimiter,
        "sliding_window": strategies.SlidingWindowCounterRateLimiter,
        "sliding_log": strategies.MovingWindowRateLimiter,
    }.get(algorithm)
    if cls is None:
        return None
    limiter = cls(storage.RedisStorage(url(client)))
    item = parse(rate)
    names = [f"user:{i}" for i in range(keys)]
    return lambda i: limiter.hit(item, names[i % keys])


def throttled_peer(
    client: redis.Redis, algorithm: str, rate: str, keys: int
) -> Callable[[int], Any] | None:
    from throttled import Throttled, rate_limiter, store

    if algorithm == "sliding_log":
        return None
    count, per = rate.split("/")
    per_unit = {"second": rate_limiter.per_sec, "minute": rate_limiter.per_min}
    quota = {**per_unit, "hour": rate_limiter.per_hour}[per](int(count))
    throttle = Throttled(using=algorithm, quota=quota, store=store.RedisStore(server=url(client)))
    names = [f"user:{i}" for i in range(keys)]
    return lambda i: throttle.limit(names[i % keys])


def pyrate_peer(
    client: redis.Redis, algorithm: str, rate: str, keys: int
) -> Callable[[int], Any] | None:
    import pyrate_limiter as p

    count, per = rate.split("/")
    units = {"second": p.Duration.SECOND, "minute": p.Duration.MINUTE, "hour": p.Duration.HOUR}
    rates = [p.Rate(int(count), units[per])]
    raw = redis.Redis(port=client.connection_pool.connection_kwargs["port"])
    if algorithm == "sliding_log":
        buckets = [p.RedisBucket.init(rates, raw, f"pyr:{i}") for i in range(keys)]
    elif algorithm in ("gcra", "token_bucket"):
        algo = p.GCRA if algorithm == "gcra" else p.TokenBucket
        buckets = [
            p.StateBucket(rates, algo(), p.RedisStateStore(raw, f"pyr:{i}")) for i in range(keys)
        ]
    else:
        return None
    now = time.time
    return lambda i: buckets[i % keys].put(p.RateItem("x", int(now() * 1000), 1))


PEERS = {"limits": limits_peer, "throttled-py": throttled_peer, "pyrate-limiter": pyrate_peer}


# ---------------------------------------------------------------- the four parts


def part_a(n: int) -> None:
    rows = []
    batch = 500
    for pinned in (False, True):
        with redis_server(pinned) as client, pinned_client(pinned):
            runs = {
                "raw": raw_evalsha(client, "fixed_window", "1000000/minute", 1000),
                "ours": ours(client, "fixed_window", "1000000/minute", 1000),
            }
            spent = {"raw": 0.0, "ours": 0.0}
            cpu = {"raw": 0.0, "ours": 0.0}
            best = {"raw": float("inf"), "ours": float("inf")}
            for run in runs.values():
                for i in range(batch):
                    run(i)
            for _ in range(max(1, n // batch)):  # interleaved batches: noise hits both alike
                for name, run in runs.items():
                    start, cpu0 = time.perf_counter(), time.process_time()
                    for i in range(batch):
                        run(i)
                    took = time.perf_counter() - start
                    cpu[name] += time.process_time() - cpu0
                    spent[name] += took
                    best[name] = min(best[name], took)
            calls = max(1, n // batch) * batch
            rows.append(
                [
                    "pinned (taskset -c 0)" if pinned else "unpinned",
                    f"{calls / spent['raw']:,.0f}",
                    f"{calls / spent['ours']:,.0f}",
                    f"{spent['raw'] / spent['ours']:.1%}",
                    f"{best['raw'] / best['ours']:.1%}",
                    f"{cpu['raw'] * 1e6 / calls:.1f}",
                    f"{cpu['ours'] * 1e6 / calls:.1f}",
                ]
            )
    table(
        f"(a) sync Limiter.hit vs raw EVALSHA loop, fixed_window, {n:,} calls each, "
        f"interleaved batches of {batch}",
        [
            "placement",
            "raw EVALSHA/s",
            "Limiter.hit/s",
            "ours/raw (all)",
            "ours/raw (best batch)",
            "client CPU us raw",
            "client CPU us ours",
        ],
        rows,
    )


def part_b(n: int, keys: int, rounds: int) -> None:
    rows = []
    with redis_server(False) as client:
        for algorithm in ALGORITHMS:
            runs: dict[str, Callable[[int], Any]] = {}
            for name, make in [("ratekeeper", ours), *PEERS.items()]:
                run = make(client, algorithm, "1000/minute", keys)
                if run is not None:
                    runs[name] = run
            per_round: dict[str, list[dict[str, Any]]] = {name: [] for name in runs}
            names = list(runs)
            for r in range(rounds):  # interleaved, order rotated: load on the machine hits all
                for name in names[r % len(names) :] + names[: r % len(names)]:
                    client.flushall()
                    runs[name](0)
                    per_round[name].append(measure(client, n, runs[name]))
            for name, ms in per_round.items():
                ratios = sorted(
                    m["rate"] / o["rate"] for m, o in zip(ms, per_round["ratekeeper"], strict=True)
                )
                rows.append(
                    [
                        algorithm,
                        name,
                        f"{median(m['rate'] for m in ms):,.0f}",
                        f"{ratios[rounds // 2]:.2f} ({ratios[0]:.2f}-{ratios[-1]:.2f})",
                        f"{median(m['cpu_us'] for m in ms):.1f}",
                        f"{median(m['cmd_us'] for m in ms):.1f}",
                        ms[-1]["shape"],
                    ]
                )
    table(
        f"(b) same Redis and algorithm, 1000/minute over {keys:,} keys, {n:,} hits each, "
        f"unpinned; median of {rounds} interleaved rounds (ratio: median, lowest-highest)",
        [
            "algorithm",
            "library",
            "decisions/s",
            "vs ours",
            "Redis CPU us/dec",
            "top-level us/dec",
            "commands (most called first)",
        ],
        rows,
    )


def median(values: Iterable[float]) -> float:
    """The middle value (the upper one of an even count)."""
    ordered = sorted(values)
    return ordered[len(ordered) // 2]


def fill(
    client: redis.Redis,
    name: str,
    algorithm: str,
    keys: int,
    layout: CompactLayout | None = None,
    rate: str = MEMORY_RATE,
    clock: ManualClock | None = None,
) -> float:
    """Bytes of used_memory per key after one hit on each of ``keys`` keys."""
    before: int = client.info("memory")["used_memory"]
    if name == "ratekeeper":
        limiter = Limiter(RedisStore(client=client), clock=clock or time.time, fail_open=False)
        codec = Codec(layout=layout)
        for start in range(0, keys, 1000):
            pipe = client.pipeline(transaction=False)
            for i in range(start, min(keys, start + 1000)):
                plan = limiter._core.plan("hit", f"user:{i}", rate, algorithm, 1, None, None)
                pipe.execute_command(*fallback(codec.command(plan)))  # type: ignore[no-untyped-call]  # untyped in redis-py
            pipe.execute()
    else:
        run = PEERS[name](client, algorithm, MEMORY_RATE, keys)
        assert run is not None
        for i in range(keys):
            run(i)
    used: int = client.info("memory")["used_memory"]
    return (used - before) / keys


def part_c(keys: int) -> None:
    rows = []
    for algorithm in ALGORITHMS:
        for name in ["ratekeeper", *PEERS]:
            with redis_server(False) as client:  # a fresh server each: nothing left over
                if name != "ratekeeper" and PEERS[name](client, algorithm, MEMORY_RATE, 1) is None:
                    continue
                per_key = fill(client, name, algorithm, keys)
                sample = next(iter(client.scan_iter(count=1000)), b"")
                size = client.memory_usage(sample) or 0
                rows.append(
                    [
                        algorithm,
                        name,
                        f"{per_key:.0f}",
                        f"{size}",
                        sample.decode(errors="replace")[:40],
                    ]
                )
    with redis_server(False) as client:
        limiter = Limiter(RedisStore(client=client), fail_open=False)
        for _ in range(10_000):
            limiter.hit("one", "10000/minute", algorithm="sliding_log")
        key = next(iter(client.scan_iter()))
        log_bytes = client.memory_usage(key) or 0
    table(
        f"(c) Redis memory per key, {keys:,} keys with one hit each ({MEMORY_RATE}), fresh servers",
        ["algorithm", "library", "used_memory/key", "MEMORY USAGE", "sample key"],
        rows,
    )
    print(
        f"    sliding_log, one key with 10,000 admitted entries: MEMORY USAGE {log_bytes:,} B"
        f" = {log_bytes / 10_000:.1f} B per entry"
    )


def part_d() -> None:
    rows = []
    with redis_server(False) as client:
        for per_window in (10, 1_000, 10_000):
            for algorithm in ("sliding_window", "sliding_log"):
                client.flushall()
                clock = ManualClock()
                limiter = Limiter(RedisStore(client=client), clock=clock, fail_open=False)
                rate = f"{per_window}/minute"
                step = 60 / per_window
                warm, n = 2 * per_window, max(per_window, 2000)

                def run(_: int) -> None:
                    clock.advance(step)  # noqa: B023 - used in this iteration only
                    limiter.hit("k", rate, algorithm=algorithm)  # noqa: B023

                for i in range(warm):
                    run(i)
                m = measure(client, n, run)
                size = sum(client.memory_usage(k) or 0 for k in client.scan_iter())
                rows.append(
                    [
                        f"{per_window:,}",
                        algorithm,
                        f"{m['cmd_us']:.1f}",
                        f"{m['cpu_us']:.1f}",
                        f"{size:,}",
                    ]
                )
    table(
        "(d) one key at a steady N requests per window (limit N/minute, ManualClock)",
        ["requests/window", "algorithm", "script us/dec", "Redis CPU us/dec", "MEMORY USAGE B"],
        rows,
    )


COMPACT = CompactLayout(buckets=4096)
COMPACT_ALGORITHMS = ["fixed_window", "token_bucket", "gcra", "sliding_window"]


def part_e(keys: int, rounds: int, hits: int) -> None:
    """The compact layout against the default one: memory per key, then script time."""
    rows = []
    for algorithm in COMPACT_ALGORITHMS:
        row = [algorithm]
        for layout in (None, COMPACT):
            with redis_server(False) as client:
                row.append(f"{fill(client, 'ratekeeper', algorithm, keys, layout):.1f}")
                if layout is not None:
                    encodings = {
                        client.object("encoding", k).decode() for k in client.scan_iter(count=1000)
                    }
                    row.append(f"{client.dbsize():,} hashes, {'/'.join(sorted(encodings))}")
        row.insert(3, f"{float(row[2]) / float(row[1]):.2f}")
        rows.append(row)
    table(
        f"(e1) Redis memory per key, {keys:,} keys with one hit each ({MEMORY_RATE}), default "
        f"layout vs CompactLayout(buckets={COMPACT.buckets}), fresh servers",
        ["algorithm", "default B/key", "compact B/key", "compact/default", "compact keys"],
        rows,
    )
    rows = []
    with redis_server(False) as client:
        for algorithm in COMPACT_ALGORITHMS:
            usec = {"default": [0.0] * rounds, "compact": [0.0] * rounds}
            setups = {}
            for name, layout in (("default", None), ("compact", COMPACT)):
                clock = ManualClock()
                fill(client, "ratekeeper", algorithm, keys, layout, "1000/hour", clock)
                store = RedisStore(client=client, layout=layout)
                setups[name] = (store.codec, Limiter(store, clock=clock), clock)
                client.script_load(script(algorithm, "compact" if layout else "keys").source)
            for r in range(rounds):  # interleaved, in turns: load on the machine hits both alike
                order = list(setups.items()) if r % 2 else list(setups.items())[::-1]
                for name, (codec, limiter, clock) in order:
                    commands = []
                    for i in range(hits):
                        clock.advance(0.001)
                        key = f"user:{(i * 7919 + r * 104729) % keys}"
                        plan = limiter._core.plan("hit", key, "1000/hour", algorithm, 1, None, None)
                        commands.append(codec.command(plan))
                    client.config_resetstat()
                    for start in range(0, hits, 500):
                        pipe = client.pipeline(transaction=False)
                        for command in commands[start : start + 500]:
                            pipe.execute_command(*command)  # type: ignore[no-untyped-call]  # untyped in redis-py
                        pipe.execute()
                    stats = client.info("commandstats")["cmdstat_evalsha"]
                    usec[name][r] = stats["usec"] / stats["calls"]
            d, c = usec["default"], usec["compact"]
            med = sorted(x / y for x, y in zip(c, d, strict=True))[rounds // 2]
            rows.append(
                [
                    algorithm,
                    f"{sum(d) / rounds:.2f}",
                    f"{sum(c) / rounds:.2f}",
                    f"{sum(c) / sum(d):.2f}",
                    f"{med:.2f}",
                    f"{min(c) / min(d):.2f}",
                ]
            )
            client.flushall()
    table(
        f"(e2) script time per decision (EVALSHA usec), hits on {keys:,} live keys (1000/hour), "
        f"{rounds} interleaved rounds of {hits:,} each",
        [
            "algorithm",
            "default us",
            "compact us",
            "compact/default",
            "median pair ratio",
            "best/best",
        ],
        rows,
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="10x fewer calls and keys")
    parser.add_argument("--only", default="a,b,c,d,e", help="comma-separated parts to run")
    parser.add_argument("--rounds", type=int, default=5, help="rounds of part (b) (default 5)")
    args = parser.parse_args()
    scale = 10 if args.quick else 1
    parts = set(args.only.split(","))
    version = subprocess.run(["redis-server", "--version"], capture_output=True, text=True)
    print(
        f"redis-server {version.stdout.split()[2]}, "
        f"{os.cpu_count()} CPUs, load {os.getloadavg()[0]:.1f} (shared machine: figures are noisy)"
    )
    if "a" in parts:
        part_a(20_000 // scale)
    if "b" in parts:
        part_b(10_000 // scale, 1000, args.rounds)
    if "c" in parts:
        part_c(100_000 // scale)
    if "d" in parts:
        part_d()
    if "e" in parts:
        part_e(100_000 // scale, 20, 5_000 // scale)


if __name__ == "__main__":
    main()
