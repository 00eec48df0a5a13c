"""Hostile input becomes counted bad lines, in bounded memory and linear work: overlong
lines (one of 50 MB, a gzip bomb of one), JSON nested past any sane depth or past Python's
recursion limit, CSV fields past the ``csv`` module's limit."""

from __future__ import annotations

import gzip
import io
import json
import random
import tracemalloc
import zlib
from pathlib import Path

import pytest

from ratekeeper.cli import main
from ratekeeper.simulate.reading import lines
from ratekeeper.simulate.reading.lines import Blocks
from ratekeeper.simulate.reading.logs import LogReader

GOOD = '10.0.0.{i} - - [10/Oct/2000:13:55:{s:02d} -0700] "GET /a HTTP/1.1" 200 12 "-" "x"\n'


def good(n: int, start: int = 0) -> str:
    return "".join(GOOD.format(i=i % 200, s=(start + i) % 60) for i in range(n))


@pytest.mark.parametrize("seed", range(30))
def test_blocks_are_whole_lines_and_overlong_ones_are_dropped(
    seed: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Random line lengths around the limit and the block size, read in random block sizes:
    every line comes out whole, in order, except those over the limit, each replaced by one
    stand-in that knows its length and first characters."""
    rng = random.Random(seed)
    monkeypatch.setattr(lines, "BLOCK_CHARS", rng.choice((1, 2, 7, 64, 1000)))
    limit = rng.choice((1, 5, 50, 200))
    text = []
    for _ in range(rng.randrange(0, 60)):
        n = rng.choice((0, 1, limit - 1, limit, limit + 1, 3 * limit, rng.randrange(0, 4 * limit)))
        text.append("".join(rng.choice("ab é") for _ in range(max(n, 0))))
    data = "\n".join(text) + rng.choice(("", "\n"))
    blocks = Blocks(io.BytesIO(data.encode()), limit)
    got = [line for block in blocks for line in block.split("\n")[:-1]]
    expected = data.split("\n")
    if data.endswith("\n") or not data:
        expected.pop()
    assert len(got) == len(expected)
    for line, want in zip(got, expected, strict=True):
        if len(want) > limit:
            head, why = blocks.overlong_reason(line) or ("", "")
            assert want.startswith(head) and len(head) == min(len(want), lines.HEAD)
            assert f"line of {len(want):,} characters" in why
        else:
            assert line == want
    assert blocks.chars == len(data)


def test_a_50_mb_line_is_one_bad_line_in_bounded_memory() -> None:
    """The line is dropped as it streams past: memory stays near one block and --max-line,
    not its 50 MB (reading it whole, or joining its pieces again and again, would hold it)."""
    huge = "9" * (50 << 20)
    data = (
        good(3)
        + '10.0.0.1 - - [10/Oct/2000:13:55:36 -0700] "GET /'
        + huge
        + '" 200 1\n'
        + good(3, 3)
    ).encode()
    del huge
    reader = LogReader()
    tracemalloc.start()
    try:
        entries = list(reader.read(io.BytesIO(data)))
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 8 << 20
    assert len(entries) == 6
    stats = reader.stats
    assert (stats.lines, stats.parsed, stats.unparsable) == (7, 6, 1)
    number, text, why = stats.samples[0]
    assert number == 4 and text.startswith('10.0.0.1 - - [10/Oct/2000:13:55:36 -0700] "GET /999')
    assert (
        why
        == f"line of {len(data) - len(good(6)) - 1:,} characters is longer than --max-line 65,536"
    )


def test_a_gzip_bomb_is_read_in_bounded_memory(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """256 MB of one line in a 250 kB gzip file, between good lines: one bad line."""
    bomb = tmp_path / "access.log.gz"
    z = zlib.compressobj(9, zlib.DEFLATED, 31)  # gzip framing
    parts = [z.compress(good(50).encode())]
    chunk = b"A" * (1 << 20)
    for _ in range(256):
        parts.append(z.compress(chunk))
    parts.append(z.compress(b"\n" + good(50, 50).encode()))
    parts.append(z.flush())
    bomb.write_bytes(b"".join(parts))
    assert bomb.stat().st_size < 1 << 20
    tracemalloc.start()
    try:
        code = main(["simulate", str(bomb), "--limit", "a=10/minute", "--no-progress", "--json",
                     str(tmp_path / "r.json")])  # fmt: skip
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert code == 0
    assert peak < 16 << 20
    data = json.loads((tmp_path / "r.json").read_text())
    assert (data["lines"], data["parsed"], data["unparsable"]) == (101, 100, 1)
    assert "268,435,456 characters" in data["unparsable_samples"][0]["why"]


@pytest.mark.parametrize(
    ("line", "why"),
    [
        ("[" * 200_000, "longer than --max-line"),
        ("[" * 50_000, "nested deeper than 16 levels"),  # past Python's recursion limit
        ('{"a":' * 40 + "1" + "}" * 40, "nested deeper than 16 levels"),
        ('{"ts": 1700000000, "ip": "1.1.1.1", "x": [' + "[" * 30 + "]" * 31 + "}", "nested deeper"),
        ('{"ts": 1700000000, "ip": "1.1.1.1"', "not JSON"),
        ('"just a string"', "not a JSON object"),
    ],
)
def test_hostile_json_lines_are_counted_bad(line: str, why: str) -> None:
    ok = "".join(json.dumps({"ts": 1_700_000_000 + i, "ip": "10.0.0.1"}) + "\n" for i in range(5))
    reader = LogReader()
    entries = list(reader.read(io.BytesIO((ok + line + "\n" + ok).encode())))
    assert len(entries) == 10
    assert reader.stats.unparsable == 1 and reader.stats.lines == 11
    assert why in reader.stats.samples[0][2]


def test_a_csv_field_past_the_csv_module_limit_is_a_bad_line() -> None:
    header = "ts,ip,note\n"
    ok = "".join(f"{1_700_000_000 + i},10.0.0.1,x\n" for i in range(5))
    big = f'1700000009,10.0.0.2,"{"z" * 200_000}"\n'
    reader = LogReader("csv", max_line=1 << 20)
    entries = list(reader.read(io.BytesIO((header + ok + big + ok).encode())))
    assert len(entries) == 10 and reader.stats.unparsable == 1
    assert (
        "not CSV" in reader.stats.samples[0][2]
        and "field larger than field limit" in reader.stats.samples[0][2]
    )


def test_bad_lines_never_stop_the_run(tmp_path: Path) -> None:
    log = tmp_path / "access.log"
    log.write_bytes(
        good(40).encode()
        + b"\x00\xff\xfe garbage \x00\n"
        + b"[" * 300_000
        + b"\n"
        + good(40, 40).encode()
    )
    out = tmp_path / "r.json"
    code = main(
        ["simulate", str(log), "--limit", "a=5/minute", "--json", str(out), "--no-progress"]
    )
    assert code == 0
    data = json.loads(out.read_text())
    assert (data["parsed"], data["unparsable"]) == (80, 2)


def test_gzip_is_read_in_blocks_not_whole(tmp_path: Path) -> None:
    """A gzip stream is decompressed as it is read: a 10 MB log holds far less."""
    path = tmp_path / "big.log.gz"
    with gzip.open(path, "wb", compresslevel=1) as f:
        f.write(good(200).encode() * 500)
    reader = LogReader()
    tracemalloc.start()
    try:
        with lines.open_log(str(path)) as stream:
            for batch in reader.runs(stream, "ip"):
                del batch
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert reader.stats.parsed == 100_000
    assert peak < 16 << 20
