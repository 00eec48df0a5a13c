"""The replay's fast paths give what the general paths give, on random logs.

- ``LogReader.read`` parses a combined log a block of lines at a time: it yields the entries,
  counts and samples that a plain line-by-line parse (``reference``, below) gives.
- ``LogReader.runs`` (one field, lines grouped by time) is ``read`` grouped, in every format.
- ``OneRate`` (one rate's states in a dict of its own) decides and holds what
  ``MemoryStore.hit_one`` decides and holds, for every algorithm and option.
- ``CandidatesTarget.decide_runs`` (``OneRate`` over runs) reports what ``decide``
  (``Limiter.hit`` per entry, on a ``MemoryStore``) reports, for every algorithm and option
  ``--limit`` takes, with and without suggestions, whole or split across files given in any
  order, with late lines and missing keys.
"""

from __future__ import annotations

import io
import json
import random
import re
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from ratekeeper import ManualClock
from ratekeeper.plan import make_policy
from ratekeeper.simulate import onerate
from ratekeeper.simulate.reading import lines
from ratekeeper.simulate.reading.logs import LogReader, LogStats
from ratekeeper.simulate.reading.times import TimeParser
from ratekeeper.simulate.replay import Options, replay
from ratekeeper.simulate.targets import Candidate, CandidatesTarget
from ratekeeper.stores.memory import MemoryStore

LINE = re.compile(
    r'(\S+) \S+ (\S+) \[([^\]]+)\] "(\S+) (\S+)(?: (\S+))?" (\d{3}) (\S+)'
    r'(?: "([^"]*)" "([^"]*)")?'
)
NAMES = ("ip", "user", "time", "method", "path", "protocol", "status", "bytes", "referer",
         "user_agent")  # fmt: skip


def reference(data: bytes) -> tuple[list[tuple[float, dict[str, str]]], LogStats]:
    """A combined log parsed one line at a time, with the format's regular expression."""
    stats = LogStats()
    parse = TimeParser()
    out = []
    for n, line in enumerate(io.TextIOWrapper(io.BytesIO(data), "utf-8", "replace"), 1):
        stats.lines = n
        stats.bytes_read += len(line)
        m = LINE.match(line)
        if m is None:
            if line.strip():
                stats.bad(n, line.rstrip("\n"), "not in combined log format")
            continue
        fields = dict(zip(NAMES, m.groups(""), strict=True))
        when = fields.pop("time")
        try:
            t = parse(when)
        except ValueError:
            stats.bad(n, line.rstrip("\n"), f"time {when!r} is not [dd/Mon/yyyy:HH:MM:SS +zone]")
            continue
        if fields["user"] == "-":
            del fields["user"]
        stats.parsed += 1
        out.append((t, fields))
    return out, stats


def random_log(rng: random.Random, lines: int) -> bytes:
    """Combined lines with odd corners: bad lines and times, blank lines, CR and CRLF line
    ends, bad UTF-8, quotes in paths, no protocol or no referer, text after the format, lines
    in completion order (stamped up to 9 s before the line before them)."""
    t = 1_700_000_000
    out = []
    for _ in range(lines):
        t += rng.choice((0, 0, 0, 1, 1, 7, 61))
        stamped = t - rng.choice((0, 0, 0, 0, 0, 2, 9))  # written when done, stamped at arrival
        when = datetime.fromtimestamp(stamped, UTC).strftime("%d/%b/%Y:%H:%M:%S +0000")
        ip = rng.choice(("1.1.1.1", "2.2.2.2", "3.3.3.3", "10.0.0.4", "::1"))
        user = rng.choice(("-", "-", "alice", "bob"))
        path = rng.choice(("/a", "/b?x=1", '/q"uote', "/é"))
        request = rng.choice((f"GET {path} HTTP/1.1", f"POST {path}", f"GET {path} HTTP/1.1 x"))
        tail = rng.choice((' "-" "curl/8"', ' "http://r/" "a \\"b\\""', "", ' "r"', " extra"))
        line = f'{ip} - {user} [{when}] "{request}" {rng.choice((200, 304, 429))} 12{tail}'
        kind = rng.random()
        if kind < 0.04:
            line = "garbage " * rng.randrange(3)
        elif kind < 0.06:
            line = line.replace(when, "yesterday")
        elif kind < 0.07:
            line = "   "
        end = rng.choice(("\n",) * 12 + ("\r\n", "\r"))
        raw = (line + end).encode()
        if rng.random() < 0.02:
            raw = raw.replace(b"- ", b"\xff\xfe ", 1)
        out.append(raw)
    data = b"".join(out)
    return data.rstrip(b"\n") if rng.random() < 0.5 else data


def parsed(data: bytes) -> tuple[list[tuple[float, dict[str, str]]], LogStats]:
    reader = LogReader("combined")
    entries = [(e.time, dict(e.fields)) for e in reader.read(io.BytesIO(data))]
    return entries, reader.stats


@pytest.mark.parametrize("block", [lines.BLOCK_CHARS, 7, 64, 300])
@pytest.mark.parametrize("seed", range(6))
def test_block_parsing_equals_line_by_line(
    seed: int, block: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(lines, "BLOCK_CHARS", block)
    data = random_log(random.Random(seed), 400)
    got, stats = parsed(data)
    want, expected = reference(data)
    assert got == want
    assert stats == expected
    assert stats.unparsable > 20 and stats.parsed > 200  # the corners were there


def grouped(entries: list[tuple[float, dict[str, str]]], name: str) -> list[Any]:
    """Entries as one list of runs: consecutive entries of one time."""
    out: list[Any] = []
    for t, fields in entries:
        if not out or out[-1][0] != t:
            out.append((t, []))
        out[-1][1].append(fields.get(name))
    return out


def runs_of(data: bytes, name: str, fmt: str = "auto") -> tuple[list[Any], LogStats]:
    """``LogReader.runs``, its lists joined and runs split between lists joined again."""
    reader = LogReader(fmt)
    out: list[Any] = []
    for batch in reader.runs(io.BytesIO(data), name):
        for t, values in batch:
            assert values  # a run holds at least one line
            if out and out[-1][0] == t:
                out[-1][1].extend(values)
            else:
                out.append((t, list(values)))
    return out, reader.stats


@pytest.mark.parametrize("name", [*NAMES, "x-api-key"])
@pytest.mark.parametrize("block", [lines.BLOCK_CHARS, 50])
def test_runs_are_the_entries_grouped(
    name: str, block: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(lines, "BLOCK_CHARS", block)
    for seed in range(3):
        data = random_log(random.Random(seed), 300)
        entries, stats = parsed(data)
        got, run_stats = runs_of(data, name)
        assert got == grouped(entries, name)
        assert run_stats == stats


@pytest.mark.parametrize("fmt", ["jsonl", "csv"])
def test_runs_of_json_and_csv_logs_are_their_entries_grouped(
    fmt: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    import ratekeeper.simulate.reading.logs as logs

    monkeypatch.setattr(logs, "RUN_LINES", 5)  # runs split between lists
    rng = random.Random(3)
    rows = []
    t = 1_700_000_000
    for _ in range(200):
        t += rng.choice((0, 0, 1, 30))
        ip = rng.choice(("1.1.1.1", "2.2.2.2", ""))
        rows.append((t, ip))
    if fmt == "jsonl":
        text = "".join(json.dumps({"ts": t, "remote_addr": ip}) + "\n" for t, ip in rows)
        text += "not json\n"
    else:
        text = "ts,remote_addr\n" + "".join(f"{t},{ip}\n" for t, ip in rows) + "1,2,3\n"
    data = text.encode()
    reader = LogReader(fmt)
    entries = [(e.time, dict(e.fields)) for e in reader.read(io.BytesIO(data))]
    for name in ("ip", "remote_addr", "path"):
        got, stats = runs_of(data, name, fmt)
        assert got == grouped(entries, name)
        assert stats == reader.stats
    assert reader.stats.unparsable == 1


class General:
    """A target offering only the general path (``decide`` per entry)."""

    def __init__(self, target: CandidatesTarget) -> None:
        self.target = target
        self.limits = target.limits
        self.left_out = target.left_out
        self.clock = target.clock
        self.decide = target.decide

    def fresh(self) -> General:
        return General(self.target.fresh())


POLICIES = [
    ("fixed_window", {}),
    ("fixed_window", {"aligned": True}),
    ("fixed_window", {"count_rejected": True}),
    ("fixed_window", {"aligned": True, "count_rejected": True}),
    ("sliding_window", {}),
    ("sliding_window", {"buckets": 4}),
    ("sliding_log", {}),
    ("token_bucket", {}),
    ("token_bucket", {"burst": 7}),
    ("gcra", {}),
    ("gcra", {"burst": 1}),
]


@pytest.mark.parametrize(("algorithm", "options"), POLICIES)
@pytest.mark.parametrize("seed", range(3))
def test_one_rate_decides_and_holds_what_the_memory_store_does(
    algorithm: str, options: dict[str, Any], seed: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(onerate, "SWEEP_FROM", 8)  # sweeps run, often
    rng = random.Random(seed)
    rate = rng.choice(("3/second", "5/10 seconds", "4/minute"))
    policy = make_policy(
        rate, algorithm, options.get("burst"), options.get("buckets"),
        options.get("aligned", False), options.get("count_rejected", False),
    )  # fmt: skip
    slot, step, limit = policy.slots[0], policy.algorithm, policy.limits[0]
    store = MemoryStore(max_keys=1_000_000, sweep_every=5)
    one = onerate.OneRate(step, limit)
    keys = [f"k{i}" for i in range(rng.choice((2, 12)))]
    now = 1_700_000_000_000
    rejections = 0
    for _ in range(100):
        runs = []
        for _ in range(rng.randrange(1, 5)):  # a list of runs, times rising
            now += rng.choice((0, 0, 1, 250, 999, 1000, 4000, 61_000))
            runs.append((now / 1000, now, [rng.choice(keys) for _ in range(rng.randrange(1, 9))]))
        want = [
            [k for k in run_keys if not store.hit_one(slot, k, step, limit, ms, 1)[0]]
            for _, ms, run_keys in runs
        ]
        assert one.hit_runs(runs) == want
        rejections += sum(map(len, want))
        live = {k: e for (_, k), e in store._data.items() if e[0] > now}
        assert {k: e for k, e in one.states.items() if e[0] > now} == live
    assert rejections > 10


def report(
    tmp_path: Path,
    data: bytes,
    limits: dict[str, str | Candidate],
    fast: bool,
    suggest: bool,
    split: int = 1,
    window: float = 180.0,
    field: str = "ip",
    late: str = "sort",
) -> Any:
    """The JSON report of ``limits`` over ``data`` (split in ``split`` files by line,
    given newest first), by ``decide_runs`` (``fast``) or by ``decide``."""
    chunks = data.split(b"\n")
    paths = []
    for i in range(split):
        log = tmp_path / f"access.log.{i}"
        log.write_bytes(
            b"\n".join(chunks[i * len(chunks) // split : (i + 1) * len(chunks) // split])
        )
        paths.append(str(log))
    target: Any = CandidatesTarget(limits, field, "fixed_window", ManualClock(0))
    if not fast:
        target = General(target)
    options = Options(paths[::-1], suggest=suggest, window=window, late=late)
    got = replay(target, options, "candidates").to_json()
    del got["seconds"], got["suggest_seconds"], got["lines_per_second"], got["files"]
    # a few late lines as examples: a run of them is one example on the fast path (with its
    # key field's value), each line one on the general path (with its ip); the count is exact
    assert bool(got["order"].pop("late_samples")) == bool(got["order"]["late"])
    return got


def candidates(algorithm: str) -> dict[str, str | Candidate]:
    """Three candidates of ``algorithm``: tight, loose, a stack, and one with its option."""
    out: dict[str, str | Candidate] = {
        "tight": Candidate("3/minute", "ip", algorithm),
        "loose": Candidate("20/5 minutes", "ip", algorithm),
        "two": Candidate("2/second;10/minute", "ip", algorithm),
    }
    if algorithm in ("token_bucket", "gcra"):
        out["burst"] = Candidate("2/minute", "ip", algorithm, burst=5)
    if algorithm == "sliding_window":
        out["buckets"] = Candidate("4/minute", "ip", algorithm, buckets=3)
    return out


@pytest.mark.parametrize(
    "algorithm", ["fixed_window", "sliding_window", "sliding_log", "token_bucket", "gcra"]
)
def test_candidates_fast_path_reports_what_limiter_hit_reports(
    tmp_path: Path, algorithm: str
) -> None:
    limits = candidates(algorithm)
    for seed in range(2):
        data = random_log(random.Random(seed), 1500)
        for suggest in (False, True):
            fast = report(tmp_path, data, limits, True, suggest)
            assert fast == report(tmp_path, data, limits, False, suggest)
        assert sum(limit["would_reject"] for limit in fast["limits"]) > 30
        assert fast["order"]["backward_steps"] > 50  # out of order, put back in order


@pytest.mark.parametrize(
    "algorithm", ["fixed_window", "sliding_window", "sliding_log", "token_bucket", "gcra"]
)
def test_fast_path_over_split_files_late_lines_and_missing_keys(
    tmp_path: Path, algorithm: str
) -> None:
    limits = {
        name: Candidate(c.rate, "user", c.algorithm, c.burst, c.buckets)
        for name, c in candidates(algorithm).items()
        if isinstance(c, Candidate)
    }
    data = random_log(random.Random(7), 2000)
    sorted_answer = None
    for split, window, late in ((3, 180.0, "skip"), (1, 3.0, "skip"), (4, 5.0, "skip"),
                                (1, 3.0, "sort"), (4, 5.0, "sort")):  # fmt: skip
        fast = report(tmp_path, data, limits, True, True, split, window, "user", late)
        assert fast == report(tmp_path, data, limits, False, True, split, window, "user", late)
        assert fast["limits"][0]["key_missing"] > 300  # "-": no user
        assert sum(limit["would_reject"] for limit in fast["limits"]) > 30
        if window < 180 and late == "skip":
            assert fast["order"]["late"] > 20  # late lines counted, not decided
        elif window < 180:  # every line sorted: the same decisions whatever the split
            assert fast["order"]["late"] == 0 and fast["order"]["beyond_window"] > 20
            assert fast["order"]["sorted"]
            if sorted_answer is None:
                sorted_answer = fast["limits"]
            assert fast["limits"] == sorted_answer
