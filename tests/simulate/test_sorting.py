"""Every line in time order whatever the disorder: a line further behind than ``--skew``
makes the replay read the logs again and sort every line (an external merge sort over
temporary runs; standard input and pipes from a copy made as they were read), so the
report covers the whole log; ``--late refuse`` exits 1 naming the fixes, and only
``--late skip`` gives a report on part of the log."""

from __future__ import annotations

import gzip
import json
import math
import random
import resource
import signal
import subprocess
import sys
import tempfile
import tracemalloc
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from operator import itemgetter
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ratekeeper import ManualClock
from ratekeeper.errors import LogOrderError
from ratekeeper.middleware import RateCheck, keys
from ratekeeper.simulate import replay as replay_module
from ratekeeper.simulate.reading import sort as sort_module
from ratekeeper.simulate.reading.lines import open_log
from ratekeeper.simulate.reading.logs import LogReader
from ratekeeper.simulate.reading.order import Skew, sorted_entries
from ratekeeper.simulate.reading.sort import ExternalSort
from ratekeeper.simulate.reading.sources import Source
from ratekeeper.simulate.replay import Options, replay
from ratekeeper.simulate.targets import CandidatesTarget, ChecksTarget
from tests.simulate.traffic import Line, generate

ROOT = Path(__file__).resolve().parents[2]
LINES = sorted(generate(seconds=400, normal=40, heavy=3, seed=21), key=lambda x: x.time)
"""About 2,900 requests over 400 s in time order; the heavy clients exceed 30/minute."""


def candidates() -> CandidatesTarget:
    limits = {"per-ip": "30/minute", "burst": "5/10 seconds"}
    return CandidatesTarget(limits, "ip", "gcra", ManualClock(0))


def checks() -> ChecksTarget:
    limits = [
        RateCheck("per-ip", "30/minute", key=keys.client_ip(), algorithm="token_bucket"),
        RateCheck("login", "3/minute", key=keys.client_ip(), routes=["/login"]),
    ]
    return ChecksTarget(limits, ManualClock(0), "enforce")


TARGETS: dict[str, Callable[[], Any]] = {"candidates": candidates, "checks": checks}


def write(path: Path, lines: list[Line], gz: bool) -> str:
    data = "".join(x.combined() for x in lines).encode()
    path.write_bytes(gzip.compress(data) if gz else data)
    return str(path)


def answer(paths: list[str], target: str, **options: Any) -> dict[str, Any]:
    """What the replay decided (not the files' own counts, nor how they were ordered)."""
    got = replay(TARGETS[target](), Options(paths, **options), "x").to_json()
    return {k: got[k] for k in ("limits", "decided", "late", "first", "last")}


WANT: dict[tuple[str, bool], dict[str, Any]] = {}


def sorted_answer(target: str, suggest: bool) -> dict[str, Any]:
    """The answer for the lines in time order, in one file (computed once)."""
    if (target, suggest) not in WANT:
        with tempfile.TemporaryDirectory() as tmp:
            path = write(Path(tmp) / "sorted.log", LINES, gz=False)
            WANT[target, suggest] = answer([path], target, suggest=suggest)
        assert WANT[target, suggest]["decided"] == len(LINES)
    return WANT[target, suggest]


def chunks(lines: list[Line], n: int) -> list[list[Line]]:
    size = -(-len(lines) // n)
    return [lines[i : i + size] for i in range(0, len(lines), size)]


def shaped(lines: list[Line], shape: str, pieces: int, rng: random.Random) -> list[Line]:
    """The lines in the order ``shape`` says."""
    if shape == "sorted":
        return lines
    if shape == "reversed":
        return lines[::-1]
    if shape == "rotated, newest first":  # zcat access.log.3.gz access.log.2.gz ...
        return [x for c in chunks(lines, pieces)[::-1] for x in c]
    if shape == "chunks reversed":
        return [x for c in chunks(lines, pieces * 40) for x in c[::-1]]
    if shape == "completion order":  # a line is written up to a minute after it arrived
        return sorted(lines, key=lambda x: x.time + rng.choice((0, 0, 0, 1, 5, 60)))
    out = lines[:]
    rng.shuffle(out)
    return out


@contextmanager
def small_sort(lines: int, fan_in: int, batch: int) -> Iterator[None]:
    """The sort's memory made small, so that runs are written and merged in levels."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(replay_module, "HELD_RUN_LINES", lines)
        mp.setattr(replay_module, "HELD_ENTRIES", lines)
        mp.setattr(sort_module, "FAN_IN", fan_in)
        mp.setattr(sort_module, "BATCH_LINES", batch)
        yield


def behind(files: list[list[Line]], window: float) -> bool:
    """Some line of some file is further than ``window`` behind the newest before it."""
    for lines in files:
        newest = float("-inf")
        for x in lines:
            if newest - x.time > window:
                return True
            newest = max(newest, x.time)
    return False


SHAPES = ["sorted", "reversed", "rotated, newest first", "chunks reversed", "completion order",
          "shuffled"]  # fmt: skip


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    target=st.sampled_from(sorted(TARGETS)),
    shape=st.sampled_from(SHAPES),
    pieces=st.integers(2, 6),
    files=st.integers(1, 4),
    split=st.sampled_from(["by time", "round robin"]),
    gz=st.lists(st.booleans(), min_size=4, max_size=4),
    late=st.sampled_from(["sort", "sort", "refuse"]),
    window=st.sampled_from([0.0, 5.0, 180.0]),
    memory=st.sampled_from([(10**6, 64, 1024), (300, 2, 7), (97, 3, 50)]),
    suggest=st.booleans(),
    seed=st.integers(0, 2**16),
)
def test_any_order_gives_the_time_sorted_answer_or_refuses(
    target: str,
    shape: str,
    pieces: int,
    files: int,
    split: str,
    gz: list[bool],
    late: str,
    window: float,
    memory: tuple[int, int, int],
    suggest: bool,
    seed: int,
) -> None:
    """The same lines in any order, split into files given in any order, gzip or plain:
    the answer of the lines in time order; with ``--late refuse``, that or ``LogOrderError``
    (only when a line was further behind than the window), never part of the log."""
    rng = random.Random(seed)
    ordered = shaped(LINES, shape, pieces, rng)
    if split == "by time":
        parts = chunks(ordered, files)
    else:
        parts = [ordered[i::files] for i in range(files)]
    rng.shuffle(parts)
    want = sorted_answer(target, suggest)
    with tempfile.TemporaryDirectory() as tmp, small_sort(*memory):
        paths = [write(Path(tmp) / f"access.log.{i}", p, gz[i]) for i, p in enumerate(parts)]
        try:
            got = answer(paths, target, window=window, late=late, suggest=suggest)
        except LogOrderError as exc:
            full = "the reorder buffers were full (they hold about" in str(exc)
            assert late == "refuse" and (behind(parts, window) or full), str(exc)
            assert "Sort the lines by time first" in str(exc)
            assert full or "--skew" in str(exc)
            return
    assert got == want


ROTATED = sorted(generate(seconds=2000, normal=10, heavy=2, seed=4), key=lambda x: x.time)
"""About 13,000 requests over 2,000 s: four rotated files of 500 s, each longer than the
default --skew."""


def test_rotated_logs_in_one_stream_newest_first_are_decided_whole(tmp_path: Path) -> None:
    """The issue's case: ``zcat access.log.3.gz ... access.log.1 | simulate -`` (and the
    same in one file): every line decided, the answer of the lines in time order, exit 0
    (it was a report on a quarter of the log)."""
    parts = chunks(ROTATED, 4)
    gz = [write(tmp_path / f"access.log.{i}.gz", p, gz=True) for i, p in enumerate(parts)]
    stream = b"".join(gzip.decompress(Path(p).read_bytes()) for p in gz[::-1])
    (tmp_path / "all.log").write_bytes(stream)
    sorted_log = write(tmp_path / "sorted.log", ROTATED, gz=False)
    want = cli(tmp_path, [sorted_log])
    assert want["code"] == 0 and want["report"]["decided"] == len(ROTATED)
    assert want["report"]["limits"][0]["would_reject"] > 50
    for args, data in (
        (["-"], stream),
        ([str(tmp_path / "all.log")], None),
        (gz[::-1], None),  # the rotated files given newest first, as a shell glob lists
    ):
        got = cli(tmp_path, args, data)
        assert got["code"] == 0, got["stderr"]
        report = got["report"]
        assert report["decided"] == report["parsed"] == len(ROTATED) and report["late"] == 0
        assert report["limits"] == want["report"]["limits"]
        assert report["order"]["sorted"] is (len(args) == 1)  # separate files stream


def test_a_process_substitution_is_copied_and_sorted(tmp_path: Path) -> None:
    """``simulate <(cat ...)``: a pipe by its path, copied as it is read."""
    log = write(tmp_path / "newest-first.log", shaped(ROTATED, "rotated, newest first", 3,
                random.Random(1)), gz=False)  # fmt: skip
    out = tmp_path / "r.json"
    done = subprocess.run(
        ["bash", "-c", '"$0" -m ratekeeper.cli simulate <(cat "$1") --limit per-ip=30/minute '
         '--no-progress --json "$2"', sys.executable, log, str(out)],
        capture_output=True, text=True, timeout=300, cwd=ROOT,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    report = json.loads(out.read_text())
    assert report["order"]["sorted"] and report["decided"] == len(ROTATED)
    assert report["files"][0]["path"].startswith("/dev/fd/")


def cli(
    tmp_path: Path,
    args: list[str],
    stdin: bytes | None = None,
    extra: tuple[str, ...] = (),
    prelude: str = "",
    fsize: int | None = None,
) -> dict[str, Any]:
    """``ratekeeper simulate`` as a process: its exit code, stderr and JSON report;
    ``prelude`` runs first (Python), ``fsize`` limits the size of any file it writes."""
    out = tmp_path / "report.json"
    out.unlink(missing_ok=True)
    argv = ["simulate", *args, "--limit", "per-ip=30/minute", "--json", str(out),
            "--no-progress", *extra]  # fmt: skip
    code = f"{prelude}\nimport sys\nfrom ratekeeper.cli import main\nsys.exit(main({argv!r}))"

    def limit() -> None:
        if fsize is not None:
            signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # a write past it fails instead
            resource.setrlimit(resource.RLIMIT_FSIZE, (fsize, fsize))

    done = subprocess.run(
        [sys.executable, "-c", code], input=stdin or b"", capture_output=True, timeout=300,
        cwd=ROOT, preexec_fn=limit,
    )  # fmt: skip
    report = json.loads(out.read_text()) if out.exists() and out.stat().st_size else None
    return {"code": done.returncode, "stderr": done.stderr.decode(), "report": report}


def test_late_refuse_exits_1_naming_the_fixes_and_reports_nothing(tmp_path: Path) -> None:
    stream = "".join(x.combined() for x in shaped(ROTATED, "rotated, newest first", 4,
                     random.Random(2))).encode()  # fmt: skip
    got = cli(tmp_path, ["-"], stream, ("--late", "refuse"))
    assert got["code"] == 1 and got["report"] is None
    message = got["stderr"]
    assert "standard input: a line at" in message and "--late refuse was given" in message
    assert "nothing is reported" in message
    behind = ROTATED[-1].time - chunks(ROTATED, 4)[2][0].time  # the third file's first line
    skew = f"--skew {math.ceil(behind / 60)}m or more"
    for fix in ("Sort the lines by time first", "as separate files", skew,
                "leave out --late refuse"):  # fmt: skip
        assert fix in message, fix
    # a --skew as long as the whole log streams it
    span = math.ceil((ROTATED[-1].time - ROTATED[0].time) / 60)
    again = cli(tmp_path, ["-"], stream, ("--late", "refuse", "--skew", f"{span}m"))
    assert again["code"] == 0 and again["report"]["decided"] == len(ROTATED)
    assert not again["report"]["order"]["sorted"]


def test_late_skip_is_a_report_on_part_of_the_log_and_says_so(tmp_path: Path) -> None:
    stream = "".join(x.combined() for x in shaped(ROTATED, "rotated, newest first", 4,
                     random.Random(2))).encode()  # fmt: skip
    got = cli(tmp_path, ["-"], stream, ("--late", "skip"))
    assert got["code"] == 0
    report = got["report"]
    assert report["late"] > len(ROTATED) // 2
    assert report["decided"] == len(ROTATED) - report["late"]
    assert report["order"]["late_policy"] == "skip" and not report["order"]["sorted"]


def test_no_room_for_the_sort_refuses_with_the_fixes(tmp_path: Path) -> None:
    """Temporary files that cannot be written (a file size limit: as a full disk answers)
    stop the run with exit 1 and the fixes, TMPDIR among them; never a partial report."""
    log = write(tmp_path / "newest-first.log", shaped(ROTATED, "rotated, newest first", 4,
                random.Random(3)), gz=False)  # fmt: skip
    small = "import ratekeeper.simulate.replay as r; r.HELD_RUN_LINES = 200"
    fits = cli(tmp_path, [log], prelude=small, extra=("--no-suggest",))
    assert fits["code"] == 0 and fits["report"]["order"]["sort_temporary_bytes"] > 20_000
    got = cli(tmp_path, [log], prelude=small, fsize=4_000, extra=("--no-suggest",))
    assert got["code"] == 1, got["stderr"]
    assert got["report"] is None
    message = got["stderr"]
    assert "further out of time order than --skew (180 s)" in message
    assert "the temporary files of the sort cannot be written in" in message
    assert "set TMPDIR to a directory with room" in message and "Sort the lines" in message
    # the suggestions' requests wait in a temporary file too: no room is a message as well
    spool = cli(tmp_path, [log], fsize=4_000)
    assert spool["code"] == 1 and "Traceback" not in spool["stderr"]
    assert "Set TMPDIR to a directory with room, or leave out the suggestions" in spool["stderr"]


def test_a_copy_of_standard_input_that_cannot_be_written_refuses(tmp_path: Path) -> None:
    stream = "".join(x.combined() for x in shaped(ROTATED, "rotated, newest first", 4,
                     random.Random(4))).encode()  # fmt: skip
    assert len(stream) > 1_000_000
    got = cli(tmp_path, ["-"], stream, ("--no-suggest",), fsize=200_000)
    assert got["code"] == 1 and got["report"] is None
    assert "standard input cannot be read again to be sorted: its copy in" in got["stderr"]
    # in order, the copy is never needed: the report is whole
    in_order = "".join(x.combined() for x in ROTATED).encode()
    fine = cli(tmp_path, ["-"], in_order, ("--no-suggest",), fsize=200_000)
    assert fine["code"] == 0 and fine["report"]["decided"] == len(ROTATED)


def test_standard_input_given_twice_is_refused(tmp_path: Path) -> None:
    got = cli(tmp_path, ["-", "-"])
    assert got["code"] == 2 and "given more than once" in got["stderr"]


@settings(max_examples=60, deadline=None)
@given(
    items=st.lists(
        st.tuples(st.integers(0, 30).map(float), st.lists(st.text("ab", max_size=2), max_size=3)),
        max_size=300,
    ),
    limit=st.integers(1, 50),
    fan_in=st.integers(2, 5),
    batch=st.integers(1, 9),
)
def test_the_external_sort_is_a_stable_sort(
    items: list[tuple[float, list[str]]], limit: int, fan_in: int, batch: int
) -> None:
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(sort_module, "FAN_IN", fan_in)
        mp.setattr(sort_module, "BATCH_LINES", batch)
        with ExternalSort(lambda x: x[0], limit, lines=lambda x: max(1, len(x[1]))) as s:
            rest = items
            while rest:
                n = min(len(rest), 1 + len(rest) % 7)
                s.extend(rest[:n], sum(max(1, len(x[1])) for x in rest[:n]))
                rest = rest[n:]
            assert all(len(level) < fan_in for level in s.levels)
            assert list(s.items()) == sorted(items, key=lambda x: x[0])


def test_the_sort_holds_its_limit_in_memory_not_the_log() -> None:
    """Sorting 400,000 lines with room for 20,000 holds a small part of what sorting them
    in memory holds (tracemalloc's peak; the lines are made as they are added and dropped
    as they come out, as a replay's are)."""

    def peak(limit: int) -> int:
        rng = random.Random(5)
        tracemalloc.start()
        try:
            with ExternalSort(lambda x: x[0], limit, lines=lambda x: len(x[1])) as s:
                for _ in range(400):
                    s.extend(
                        [(float(rng.randrange(10**6)), [f"10.0.{rng.randrange(250)}.7"])
                         for _ in range(1000)],
                        1000,
                    )  # fmt: skip
                for _ in s.items():
                    pass
                assert (s.written > 0) is (limit < 400_000)
            return tracemalloc.get_traced_memory()[1]
        finally:
            tracemalloc.stop()

    small, whole = peak(20_000), peak(10**6)
    assert small * 4 < whole, (small, whole)


def test_a_file_renamed_between_the_readings_is_read_again_one_truncated_is_refused(
    tmp_path: Path,
) -> None:
    """The second reading reads the file the first opened: a rotation that renames it and
    starts a new one at its path changes nothing; one that truncates it in place
    (copytruncate) is refused rather than read short."""
    log = tmp_path / "access.log"
    log.write_text("first line\nsecond line\n")
    source = Source(str(log), copy=True)
    try:
        with source.open() as stream:
            assert stream.readline() == b"first line\n"
        log.rename(tmp_path / "access.log.1")
        log.write_text("a new log\n")
        with source.again() as stream:
            assert stream.read() == b"first line\nsecond line\n"
    finally:
        source.close()
    source = Source(str(log), copy=True)
    try:
        with source.open() as stream:
            stream.read()
        log.write_text("")
        with pytest.raises(LogOrderError, match="it shrank between the two readings"):
            source.again()
    finally:
        source.close()


def test_gzip_streams_on_standard_input_are_copied_compressed_and_sorted(
    tmp_path: Path,
) -> None:
    """``cat access.log.3.gz access.log.2.gz ... | simulate -``: gzip members one after
    another, newest first."""
    parts = chunks(ROTATED, 4)
    stream = b"".join(gzip.compress("".join(x.combined() for x in p).encode()) for p in parts[::-1])
    got = cli(tmp_path, ["-"], stream, ("--no-suggest",))
    assert got["code"] == 0, got["stderr"]
    report = got["report"]
    assert report["order"]["sorted"] and report["decided"] == len(ROTATED)
    want = cli(
        tmp_path, [write(tmp_path / "sorted.log", ROTATED, gz=False)], None, ("--no-suggest",)
    )
    assert report["limits"] == want["report"]["limits"]


DATA = Path(__file__).parent / "data"


@pytest.mark.parametrize(
    "name",
    sorted(p.name for p in DATA.iterdir() if p.suffix in (".log", ".json", ".jsonl", ".csv")),
)
def test_every_format_s_entries_go_through_the_sort_s_temporary_files(name: str) -> None:
    """What each format's reader makes of a line (its fields, of every format) is written
    to a run and read back as it was."""
    with open_log(str(DATA / name)) as stream:
        entries = list(LogReader().read(stream))
    assert entries, name
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(sort_module, "BATCH_LINES", 2)
        with ExternalSort(itemgetter(0, 1), 3) as s:
            got = list(sorted_entries([(iter(entries[::-1]), Skew())], 180.0, s, lambda: None))
            assert s.written > 0
    want = sorted(entries, key=lambda e: (e.time, "\x1f".join(e.fields.values())))
    assert [(e.time, dict(e.fields)) for e in got] == [(e.time, dict(e.fields)) for e in want]
