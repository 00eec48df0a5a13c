"""One log gives the same decisions whatever order its lines come in: in file order
(completion order, as Apache writes), sorted, reversed in chunks, split across rotated files
given in any order, or as two servers' logs. Within the skew window the lines stream through
the reorder buffers; a line further behind makes the replay sort every line
(tests/simulate/test_sorting.py), or, asked with ``--late skip``, is late: counted, shown,
never decided."""

from __future__ import annotations

import gzip
import json
import random
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from itertools import pairwise
from pathlib import Path
from typing import Any

import pytest

from ratekeeper import ManualClock
from ratekeeper.cli import main
from ratekeeper.middleware import RateCheck, keys
from ratekeeper.simulate.reading.logs import Entry
from ratekeeper.simulate.reading.order import Late, Room, Skew, ordered_entries, ordered_runs
from ratekeeper.simulate.replay import Options, replay
from ratekeeper.simulate.targets import CandidatesTarget, ChecksTarget

START = 1_700_000_000


@dataclass(frozen=True)
class Request:
    arrived: int  # whole seconds: the combined format's resolution
    done: float
    ip: str
    path: str
    status: int
    server: str

    def line(self, skew: int = 0) -> str:
        when = datetime.fromtimestamp(self.arrived + skew, UTC).strftime("%d/%b/%Y:%H:%M:%S +0000")
        return (
            f'{self.ip} - - [{when}] "GET {self.path} HTTP/1.1" {self.status} 512 "-" '
            f'"{self.server}"\n'
        )


def traffic(seed: int, seconds: int = 900) -> list[Request]:
    """Ordinary clients and three bursty heavy ones, answered by two servers; most requests
    take under a second, some up to a minute (so lines land up to 60 s late)."""
    rng = random.Random(seed)
    out = []
    for s in range(seconds):
        t = START + s
        n = [f"10.0.{i // 250}.{i % 250}" for i in range(300) if rng.random() < 0.02]
        n += [f"203.0.113.{i}" for i in range(3) for _ in range(rng.choice((0, 0, 1, 2, 6)))]
        for ip in n:
            r = rng.random()
            took = (
                rng.uniform(0, 1)
                if r < 0.7
                else rng.uniform(1, 10)
                if r < 0.95
                else rng.uniform(10, 60)
            )
            path = rng.choice(("/", "/api/items", "/login"))
            status = 304 if rng.random() < 0.1 else 200
            out.append(Request(t, t + took, ip, path, status, rng.choice(("a", "b"))))
    return out


def completion_order(requests: list[Request]) -> list[Request]:
    return sorted(requests, key=lambda r: r.done)


def decisions(
    paths: list[Path], target: Any, window: float = 180.0, late: str = "sort"
) -> dict[str, Any]:
    """What the replay decided: every limit's report (not the files' own counts)."""
    options = Options([str(p) for p in paths], window=window, late=late)
    report = replay(target, options, "x").to_json()
    return {
        "limits": report["limits"],
        "decided": report["decided"],
        "first": report["first"],
        "last": report["last"],
    }


def candidates(algorithm: str) -> CandidatesTarget:
    return CandidatesTarget({"per-ip": "20/minute"}, "ip", algorithm, ManualClock(0))


def checks() -> ChecksTarget:
    limits = [
        RateCheck("per-ip", "20/minute", key=keys.client_ip(), algorithm="token_bucket"),
        RateCheck("login", "3/minute", key=keys.client_ip(), routes=["/login"]),
    ]
    return ChecksTarget(limits, ManualClock(0), "enforce")


def write(path: Path, lines: list[str], gz: bool = False) -> Path:
    data = "".join(lines).encode()
    path.write_bytes(gzip.compress(data) if gz else data)
    return path


def variants(tmp_path: Path, requests: list[Request]) -> dict[str, list[Path]]:
    """The same log's lines in every shape a real one comes in."""
    in_file_order = [r.line() for r in completion_order(requests)]
    by_time = sorted(requests, key=lambda r: (r.arrived, r.done))
    out: dict[str, list[Path]] = {
        "sorted": [write(tmp_path / "sorted.log", [r.line() for r in by_time])],
        "completion order": [write(tmp_path / "access.log.full", in_file_order)],
    }
    chunks = [in_file_order[i : i + 97][::-1] for i in range(0, len(in_file_order), 97)]
    out["reversed in chunks"] = [write(tmp_path / "chunks.log", [x for c in chunks for x in c])]
    third = len(in_file_order) // 3
    rotated = [
        write(tmp_path / "access.log.2.gz", in_file_order[:third], gz=True),
        write(tmp_path / "access.log.1", in_file_order[third : 2 * third]),
        write(tmp_path / "access.log", in_file_order[2 * third :]),
    ]
    out["rotated, shell order"] = sorted(rotated)  # access.log first: the newest
    out["rotated, oldest first"] = rotated
    shuffled = rotated[:]
    random.Random(5).shuffle(shuffled)
    out["rotated, any order"] = shuffled
    servers = []
    for name in ("a", "b"):
        mine = [r.line() for r in completion_order(requests) if r.server == name]
        servers.append(write(tmp_path / f"server-{name}.log", mine))
    out["two servers"] = servers
    out["two servers, the other first"] = servers[::-1]
    return out


@pytest.mark.parametrize("algorithm", ["fixed_window", "sliding_window", "token_bucket", "gcra"])
def test_every_shape_of_one_log_gives_the_same_decisions(tmp_path: Path, algorithm: str) -> None:
    requests = traffic(1)
    shapes = variants(tmp_path, requests)
    want = decisions(shapes["sorted"], candidates(algorithm))
    assert want["limits"][0]["would_reject"] > 100  # the heavy clients were limited
    for name, paths in shapes.items():
        assert decisions(paths, candidates(algorithm)) == want, name
    # the test can fail: decided in file order, completion order changes the answer
    unordered = decisions(shapes["completion order"], candidates(algorithm), 0, "skip")
    assert unordered["limits"] != want["limits"]
    # with no window at all every line is sorted: the same answer again
    assert decisions(shapes["completion order"], candidates(algorithm), 0) == want


def test_checks_decide_the_same_whatever_the_shape(tmp_path: Path) -> None:
    """The general path (entries through the middleware's gate, 304s refunded)."""
    shapes = variants(tmp_path, traffic(2, seconds=600))
    want = decisions(shapes["sorted"], checks())
    assert all(limit["would_reject"] > 20 for limit in want["limits"])
    for name in ("completion order", "reversed in chunks", "rotated, any order", "two servers"):
        assert decisions(shapes[name], checks()) == want, name


def test_two_servers_with_skewed_clocks(tmp_path: Path) -> None:
    """Server b's clock runs 20 s ahead: each file is merged by its own stamps, whatever the
    order the files are given in, and what each file's order was is reported per file."""
    requests = traffic(3, seconds=600)
    paths = []
    for name, skew in (("a", 0), ("b", 20)):
        lines = [r.line(skew) for r in completion_order(requests) if r.server == name]
        paths.append(write(tmp_path / f"{name}.log", lines))
    one = replay(candidates("gcra"), Options([str(p) for p in paths]), "x").to_json()
    other = replay(candidates("gcra"), Options([str(p) for p in paths[::-1]]), "x").to_json()
    assert one["limits"] == other["limits"]
    for f in one["files"]:
        assert f["backward_steps"] > 100 and 10 < f["largest_lag_seconds"] <= 61
        assert f["late"] == 0
    assert one["late"] == 0 and one["decided"] == len(requests)


def test_a_line_later_than_the_window_is_sorted_into_place_or_skipped_when_asked(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    requests = traffic(4, seconds=300)
    lines = [r.line() for r in sorted(requests, key=lambda r: r.arrived)]
    stray = Request(START + 10, START + 10, "198.51.100.99", "/", 200, "a").line()
    log = write(tmp_path / "access.log", [*lines, stray])  # 290 s behind the line before it
    report = tmp_path / "r.json"
    args = ["simulate", str(log), "--limit", "per-ip=20/minute", "--json", str(report),
            "--no-progress"]  # fmt: skip
    # by default every line is sorted: the stray line is decided in its place
    assert main(args) == 0
    data = json.loads(report.read_text())
    assert data["late"] == 0 and data["decided"] == len(requests) + 1
    assert data["order"]["sorted"] and data["order"]["beyond_window"] == 1
    assert data["limits"][0]["requests"] == len(requests) + 1
    out = capsys.readouterr().out
    assert "1 more than --skew (180 s) behind, so every line was sorted by time" in out
    # asked with --late skip: counted, shown, not decided, and the report says so
    assert main([*args, "--late", "skip"]) == 0
    data = json.loads(report.read_text())
    assert data["late"] == 1 and data["decided"] == len(requests)
    assert not data["order"]["sorted"] and data["order"]["late_policy"] == "skip"
    [sample] = data["order"]["late_samples"]
    assert sample["time"] == START + 10 and sample["what"] == "198.51.100.99"
    assert sample["behind_seconds"] >= 280
    assert data["limits"][0]["requests"] == len(requests)  # the late line was not decided
    out = capsys.readouterr().out
    assert "1 came too late for that and were skipped (--late skip)" in out
    assert f"this report leaves out 1 of {len(requests) + 1:,} requests" in out
    assert "198.51.100.99" in out
    # a wider window streams it in its place
    assert main([*args, "--skew", "10m", "--late", "refuse"]) == 0
    data = json.loads(report.read_text())
    assert data["late"] == 0 and not data["order"]["sorted"]
    assert data["limits"][0]["requests"] == len(requests) + 1


@pytest.mark.parametrize("seed", range(20))
def test_the_reorder_buffer_sorts_what_is_within_the_window(seed: int) -> None:
    """Random disorder of at most ``window``: every run comes out, in time order; the steps
    back are counted, and nothing is late."""
    rng = random.Random(seed)
    window = rng.choice((0.0, 1.0, 5.0, 30.0))
    raw = [rng.uniform(0, 200) for _ in range(rng.randrange(1, 300))]
    times = sorted(round(t) if rng.random() < 0.5 else t for t in raw)  # some of one time
    shown = [max(0.0, t - rng.uniform(0, window)) for t in times]  # stamped up to window early
    runs = [(t, [str(i)]) for i, t in enumerate(shown)]
    batches = [runs[i : i + 7] for i in range(0, len(runs), 7)]
    skew = Skew()
    out = [run for batch in ordered_runs(batches, window, skew) for run in batch]
    assert [t for t, _ in out] == sorted(t for t, _ in out)
    assert {t for t, _ in out} == {t for t, _ in runs}
    assert sorted(v for _, vs in out for v in vs) == sorted(str(i) for i in range(len(runs)))
    steps = sum(1 for a, b in pairwise(shown) if b < a)
    assert skew.backward == steps and skew.late == 0


@pytest.mark.parametrize("window", [0.0, 1.0, 180.0])
@pytest.mark.parametrize("late", ["sort", "skip"])
def test_lines_of_one_time_are_decided_in_one_order_whatever_the_window(
    tmp_path: Path, window: float, late: str
) -> None:
    """A 304 (refunded) and a 200 of one client in one second, under 1/minute: one order
    admits both, the other rejects the 200. Whichever order the file has them in, and
    whatever the window (``--skew 0`` too), the replay decides them in one order."""

    def line(status: int, t: int) -> Request:
        return Request(START + t, START + t, "10.9.9.9", "/feed", status, "a")

    check = RateCheck("feed", "1/minute", key=keys.client_ip())
    answers = []
    for first, second in ((304, 200), (200, 304)):
        rows = [line(first, 0), line(second, 0), line(200, 90)]
        log = write(tmp_path / f"{first}.log", [r.line() for r in rows])
        target = ChecksTarget([check], ManualClock(0), "enforce")
        answers.append(decisions([log], target, window, late)["limits"])
    assert answers[0] == answers[1]


@pytest.mark.parametrize("path", ["runs", "entries"])
def test_the_reorder_buffers_hold_a_bounded_number_of_lines(path: str) -> None:
    """A file in reverse order: every line is older than the newest, so a buffer that waits
    for a newer line would hold them all. The buffers share a ``Room``: past its limit the
    oldest lines go early, and the lines behind them are late (``Late`` unless skipped)."""
    times = [float(START + t) for t in range(3000, 0, -1)]

    def stream(skew: Skew, room: Room) -> Iterator[Any]:
        if path == "runs":
            runs = [(t, [str(t)]) for t in times]
            return ordered_runs([runs[i : i + 7] for i in range(0, len(runs), 7)], 180, skew, room)
        return ordered_entries((Entry(t, {"ip": str(t)}) for t in times), 180, skew, room=room)

    room = Room(100)
    skew = Skew(skip=True)
    out = 0
    for item in stream(skew, room):
        assert room.held <= 200
        out += len(item) if path == "runs" else 1
    assert skew.full and skew.late > 2000 and out + skew.late == len(times)
    assert room.held == 0
    with pytest.raises(Late):
        for _ in stream(Skew(), Room(100)):
            pass
    # with room enough, it is put in order whole
    whole = Skew()
    assert sum(len(i) if path == "runs" else 1 for i in stream(whole, Room(10_000))) == 3000
    assert whole.late == 0 and not whole.full
