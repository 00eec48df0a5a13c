"""Log formats, gzip, stdin, time formats and unparsable lines."""

from __future__ import annotations

import gzip
import io
import json
import subprocess
import sys
from pathlib import Path

import pytest

from ratekeeper.cli import main
from ratekeeper.simulate.reading.lines import open_log
from ratekeeper.simulate.reading.logs import LogReader
from ratekeeper.simulate.reading.times import TimeParser

COMBINED = (
    '1.2.3.4 - alice [10/Oct/2000:13:55:36 -0700] "GET /a HTTP/1.1" 200 2326 "-" "x"\n'
    "garbage line\n"
    '5.6.7.8 - - [10/Oct/2000:13:55:37 -0700] "POST /b HTTP/1.0" 304 0\n'
)


def read(text: str, **kw: object) -> tuple[list[tuple[float, dict[str, str]]], LogReader]:
    reader = LogReader(**kw)  # type: ignore[arg-type]
    entries = [(e.time, dict(e.fields)) for e in reader.read(io.BytesIO(text.encode()))]
    return entries, reader


def test_combined_and_common_formats_with_a_bad_line_counted_and_sampled() -> None:
    entries, reader = read(COMBINED)
    assert [t for t, _ in entries] == [971211336.0, 971211337.0]
    assert entries[0][1]["ip"] == "1.2.3.4" and entries[0][1]["user"] == "alice"
    assert "user" not in entries[1][1] and entries[1][1]["status"] == "304"
    stats = reader.stats
    assert (stats.lines, stats.parsed, stats.unparsable) == (3, 2, 1)
    assert stats.samples == [(2, "garbage line", "not in combined log format")]


def test_json_lines_with_configured_fields_and_iso_or_epoch_times() -> None:
    text = (
        '{"ts": "2024-05-01T12:00:00.250Z", "client_addr": "9.9.9.9", "uri": "/x", "n": 3}\n'
        '{"ts": 1714564800.5, "client_addr": "9.9.9.9"}\n'
        '{"ts": 1714564800500, "client_addr": "9.9.9.9"}\n'
        "[1, 2]\n"
        '{"no_time": 1}\n'
        "{broken\n"
    )
    entries, reader = read(text, fmt="auto", aliases={"ip": "client_addr"})
    assert [t for t, _ in entries] == [1714564800.25, 1714564800.5, 1714564800.5]
    assert entries[0][1]["ip"] == "9.9.9.9" and entries[0][1]["path"] == "/x"
    assert entries[0][1]["n"] == "3"
    assert reader.stats.unparsable == 3
    assert "no time field" in reader.stats.samples[1][2]


def test_csv_with_a_time_field() -> None:
    text = "when,remote_addr,path\n2024-05-01T12:00:00+02:00,1.1.1.1,/a\nbad,row\n"
    entries, reader = read(text, time_field="when")
    assert entries == [(1714557600.0, {"when": "2024-05-01T12:00:00+02:00",
                        "remote_addr": "1.1.1.1", "path": "/a", "ip": "1.1.1.1"})]  # fmt: skip
    assert reader.stats.unparsable == 1


def test_time_parser_caches_but_stays_exact() -> None:
    parse = TimeParser()
    a = parse("10/Oct/2000:13:55:36 -0700")
    assert parse("10/Oct/2000:13:55:59 -0700") == a + 23
    assert parse("10/Oct/2000:13:56:00 -0700") == a + 24
    assert parse("2024-05-01T00:00:59Z") == 1714521659.0
    with pytest.raises(ValueError):
        parse("yesterday")


def test_gzip_is_read_whatever_the_name(tmp_path: Path) -> None:
    path = tmp_path / "log.txt"
    path.write_bytes(gzip.compress(COMBINED.encode()))
    with open_log(str(path)) as stream:
        assert len(list(LogReader().read(stream))) == 2


def test_stdin_and_json_output(tmp_path: Path) -> None:
    out = subprocess.run(
        [sys.executable, "-m", "ratekeeper.cli", "simulate", "-", "--limit", "one=1/minute",
         "--json", "--no-progress"],
        input=COMBINED.replace("5.6.7.8", "1.2.3.4").encode(), capture_output=True, check=True,
    )  # fmt: skip
    report = json.loads(out.stdout)
    assert report["unparsable"] == 1
    [limit] = report["limits"]
    assert (limit["requests"], limit["would_reject"]) == (2, 1)
    [top] = limit["top_keys"]
    assert (top["key"], top["requests"], top["rejections"]) == ("1.2.3.4", 2, 1)
    assert (top["traffic_share"], top["rejected_share"]) == (1.0, 0.5)
    assert top["first_rejected"] == top["last_rejected"] == 971211337.0
    assert top["windows"] == {"1/1m": 1}
    assert top["timeline"]["requests"] == [[971211300, 2]]
    assert top["timeline"]["rejections"] == [[971211300, 1]]
    assert limit["rates"][0]["suggestions"][0]["rate"] == "2/1m"


def test_bad_arguments_are_named(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    assert main(["simulate", str(tmp_path / "none.log"), "--limit", "a=1/minute"]) == 2
    assert "cannot read log" in capsys.readouterr().err
    assert main(["simulate", "-", "--limit", "a=ten/minute"]) == 2
    assert "ten" in capsys.readouterr().err
    assert main(["simulate", "-"]) == 2
    assert "exactly one source" in capsys.readouterr().err
