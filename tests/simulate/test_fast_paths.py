"""The replay's fast paths give what the general paths give, on random logs.

- ``LogReader.read`` parses a combined log a block of lines at a time: it yields the entries,
  counts and samples that a plain line-by-line parse (``reference``, below) gives.
- ``LogReader.runs`` (one field, lines grouped by time) is ``read`` grouped, in every format.
- ``CandidatesTarget.decide_run`` (``MemoryStore.hit_one`` over runs) reports what
  ``decide`` (``Limiter.hit`` per entry) reports, for every algorithm, with and without
  suggestions.
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
from ratekeeper.simulate.reading import lines
from ratekeeper.simulate.reading.logs import LogReader, LogStats
from ratekeeper.simulate.reading.times import TimeParser
from ratekeeper.simulate.replay import Options, replay
from ratekeeper.simulate.targets import CandidatesTarget

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
        self.limits = target.limits
        self.left_out = target.left_out
        self.clock = target.clock
        self.decide = target.decide


def report(tmp_path: Path, data: bytes, algorithm: str, fast: bool, suggest: bool) -> Any:
    log = tmp_path / "access.log"
    log.write_bytes(data)
    limits = {"tight": "3/minute", "loose": "20/5 minutes", "two": "2/second;10/minute"}
    target: Any = CandidatesTarget(limits, "ip", algorithm, ManualClock(0))
    if not fast:
        target = General(target)
    got = replay(target, Options([str(log)], suggest=suggest), "candidates").to_json()
    del got["seconds"], got["suggest_seconds"], got["lines_per_second"]
    return got


@pytest.mark.parametrize(
    "algorithm", ["fixed_window", "sliding_window", "sliding_log", "token_bucket", "gcra"]
)
def test_candidates_fast_path_reports_what_limiter_hit_reports(
    tmp_path: Path, algorithm: str
) -> None:
    for seed in range(2):
        data = random_log(random.Random(seed), 1500)
        for suggest in (False, True):
            fast = report(tmp_path, data, algorithm, True, suggest)
            assert fast == report(tmp_path, data, algorithm, False, suggest)
        assert sum(limit["would_reject"] for limit in fast["limits"]) > 30
        assert fast["order"]["backward_steps"] > 50  # out of order, put back in order
