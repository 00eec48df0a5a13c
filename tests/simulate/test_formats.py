"""Every format parses from a real sample (tests/simulate/data, sources in its README) with the
right request count; detection from a sample of lines; times in every zone and epoch unit."""

from __future__ import annotations

import gzip
import io
import json
from pathlib import Path

import pytest

from ratekeeper.cli import main
from ratekeeper.simulate import cli
from ratekeeper.simulate.reading import formats
from ratekeeper.simulate.reading.lines import open_log
from ratekeeper.simulate.reading.logs import LogReader
from ratekeeper.simulate.reading.times import TimeParser, zone_name

DATA = Path(__file__).parent / "data"

# file, format detected, requests, bad lines, other lines, (first time, ip, method, path, status)
SAMPLES = [
    (
        "combined.log",
        "combined",
        6,
        0,
        0,
        (971211336.0, "127.0.0.1", "GET", "/apache_pb.gif", "200"),
    ),
    (
        "common.log",
        "common",
        8,
        0,
        0,
        (804571201.0, "199.72.81.55", "GET", "/history/apollo/", "200"),
    ),
    (
        "traefik.log",
        "traefik",
        4,
        0,
        0,
        (1506975727.0, "192.168.33.1", "GET", "/ui/favicons/favicon-16x16.png", "304"),
    ),
    (
        "traefik.json",
        "traefik-json",
        3,
        0,
        0,
        (1681284271.215932, "192.0.2.44", "GET", "/nope", "404"),
    ),
    ("caddy.json", "caddy", 3, 1, 0, (1646861401.5241024, "127.0.0.1", "GET", "/", "200")),
    ("cloudflare.json", "cloudflare", 5, 0, 0, (1526810289.28, "192.0.2.1", "GET", "/", "200")),
    ("alb.log", "alb", 7, 0, 0, (1530570168.364, "192.168.131.39", "GET", "/", "200")),
    (
        "cloudfront.log",
        "cloudfront",
        5,
        0,
        2,
        (1575493351.0, "192.0.2.100", "GET", "/index.html", "200"),
    ),
    ("iis.log", "iis", 4, 0, 12, (1514794150.0, "81.2.69.143", "GET", "/", "200")),
    ("ecs.jsonl", "jsonl", 3, 0, 0, (1714557600.123, "192.0.2.7", "GET", "/a", "200")),
    ("events.csv", "csv", 3, 0, 1, (1714557600.0, "192.0.2.5", "GET", "/a", "200")),
]


def read(
    path: Path, fmt: str = "auto", **kw: object
) -> tuple[list[tuple[float, dict[str, str]]], LogReader]:
    reader = LogReader(fmt, **kw)  # type: ignore[arg-type]
    with open_log(str(path)) as stream:
        entries = [(e.time, dict(e.fields)) for e in reader.read(stream)]
    return entries, reader


@pytest.mark.parametrize(("name", "fmt", "requests", "bad", "other", "first"), SAMPLES)
def test_each_sample_is_detected_and_read_with_the_right_count(
    name: str, fmt: str, requests: int, bad: int, other: int, first: tuple[object, ...]
) -> None:
    path = DATA / name
    lines = path.read_text().count("\n")
    entries, reader = read(path)
    assert reader.detected is not None and reader.detected.name == fmt
    assert reader.detected.matched == requests  # every request line of the sample read
    stats = reader.stats
    assert (stats.lines, stats.parsed, stats.unparsable, stats.other) == (
        lines, requests, bad, other,
    )  # fmt: skip
    t, fields = entries[0]
    got = (t, fields.get("ip"), fields.get("method"), fields.get("path"), fields.get("status"))
    assert got[1:] == first[1:]
    assert t == pytest.approx(first[0], abs=1e-6)
    # named instead of detected, the format reads the same
    assert read(path, fmt)[0] == entries


def test_every_sample_is_named_in_the_readme() -> None:
    readme = (DATA / "README.md").read_text()
    for name, *_ in SAMPLES:
        assert f"`{name}`" in readme
    assert sorted(p.name for p in DATA.iterdir() if p.name != "README.md") == sorted(
        s[0] for s in SAMPLES
    )


def test_the_cli_knows_every_format() -> None:
    assert set(cli.FORMATS) == set(formats.FORMATS)


def test_the_detected_format_is_printed(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["simulate", str(DATA / "alb.log"), "--limit", "a=1/minute", "--no-progress"]) == 0
    out = capsys.readouterr().out
    assert f"detected format: alb (7 of 7 sample lines) in {DATA / 'alb.log'}" in out
    assert main([
        "simulate", str(DATA / "iis.log"), "--limit", "a=1/minute", "--no-progress", "--json",
    ]) == 0  # fmt: skip
    captured = capsys.readouterr()
    assert "detected format: iis (4 of 4 sample lines)" in captured.err  # stdout is the JSON
    data = json.loads(captured.out)
    assert data["files"][0]["format"] == "iis" and data["parsed"] == 4


def test_a_comment_or_header_line_first_does_not_hide_the_format(tmp_path: Path) -> None:
    body = (DATA / "combined.log").read_text()
    log = tmp_path / "access.log"
    log.write_text("# exported from the load balancer, 2000-10-10\n" + body)
    entries, reader = read(log)
    assert reader.detected is not None and str(reader.detected) == "combined (6 of 7 sample lines)"
    assert len(entries) == 6 and reader.stats.unparsable == 1


def test_dotted_paths_name_nested_json_fields(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Keyed by the proxy in front (``request.remote_ip``) instead of the client."""
    report = tmp_path / "r.json"
    code = main([
        "simulate", str(DATA / "caddy.json"), "--limit", "proxy=1/minute,key=request.remote_ip",
        "--limit", "client=1/minute", "--json", str(report), "--no-progress",
    ])  # fmt: skip
    assert code == 0
    limits = {x["name"]: x for x in json.loads(report.read_text())["limits"]}
    assert limits["proxy"]["keys"] == 2 and limits["client"]["keys"] == 2
    assert [t["key"] for t in limits["proxy"]["top_keys"]] == ["172.71.190.23"]
    assert [t["key"] for t in limits["client"]["top_keys"]] == ["203.0.113.50"]
    entries, _ = read(DATA / "caddy.json", aliases={"ip": "request.remote_ip"})
    assert entries[0][1]["request.headers.User-Agent"] == "curl/7.82.0"
    assert entries[0][1]["request.headers.Accept-Encoding"] == "gzip, deflate, br"
    assert [f["ip"] for _, f in entries] == ["127.0.0.1", "172.71.190.23", "172.71.190.23"]


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("1714557600", 1714557600.0),
        ("1714557600.25", 1714557600.25),
        ("1714557600250", 1714557600.25),  # ms
        ("1714557600250000", 1714557600.25),  # µs
        ("1714557600250000000", 1714557600.25),  # ns (Cloudflare's default)
        ("1526810289280000000", 1526810289.28),
        ("2024-05-01T12:00:00Z", 1714564800.0),
        ("2024-05-01T12:00:00.250Z", 1714564800.25),
        ("2024-05-01T12:00:00.123456789Z", 1714564800.123456789),
        ("2024-05-01 14:00:00+02:00", 1714564800.0),
        ("2024-05-01T14:00:00+0200", 1714564800.0),
        ("2024-05-01T05:00:00-07", 1714564800.0),
        ("2024-05-01T12:00:00", 1714564800.0),  # no zone: UTC
        ("2024-05-01T12:00Z", 1714564800.0),
        ("01/May/2024:05:00:00 -0700", 1714564800.0),
        ("[01/May/2024:12:00:00 +0000]", 1714564800.0),
    ],
)
def test_times_in_every_zone_and_epoch_unit(text: str, expected: float) -> None:
    assert TimeParser()(text) == pytest.approx(expected, abs=1e-6)


@pytest.mark.parametrize(
    "text", ["yesterday", "2024-05-01", "2024-05-01T12:00:00+2", "12:00:00", ""]
)
def test_what_is_not_a_time(text: str) -> None:
    with pytest.raises(ValueError):
        TimeParser()(text)


def test_the_zone_the_log_was_written_in() -> None:
    parse = TimeParser()
    for text in ("01/May/2024:05:00:00 -0700", "01/May/2024:05:01:00 -0700", "2024-05-01T12:00Z"):
        parse(text)
    assert parse.zone == -7 * 3600 and zone_name(parse.zone) == "UTC-07:00"
    assert zone_name(19800) == "UTC+05:30" and zone_name(0) == "UTC"


@pytest.mark.parametrize("fmt", ["jsonl", "csv"])
def test_json_and_csv_lines_are_counted_once(
    fmt: str, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    rows = [(1_700_000_000 + i, f"10.0.0.{i}") for i in range(3)]
    if fmt == "jsonl":
        text = "".join(json.dumps({"ts": t, "ip": ip}) + "\n" for t, ip in rows)
    else:
        text = "ts,ip\n" + "".join(f"{t},{ip}\n" for t, ip in rows)
    log = tmp_path / "log"
    log.write_bytes(gzip.compress(text.encode()))
    assert main(["simulate", str(log), "--limit", "a=1/minute", "--no-progress"]) == 0
    out = capsys.readouterr().out
    header = 1 if fmt == "csv" else 0
    assert out.startswith(f"read {3 + header} lines (3 requests, 0 unparsable, {header} blank")


def test_w3c_fields_may_change_mid_file() -> None:
    text = (
        "#Fields: date time c-ip cs-method cs-uri-stem sc-status\n"
        "2024-05-01 12:00:00 192.0.2.1 GET /a 200\n"
        "#Fields: date time cs-uri-stem c-ip sc-status\n"
        "2024-05-01 12:00:01 /b 192.0.2.2 404\n"
        "2024-05-01 12:00:02 /b 192.0.2.2\n"
    )
    reader = LogReader()
    entries = list(reader.read(io.BytesIO(text.encode())))
    assert [(e.fields["ip"], e.fields["path"]) for e in entries] == [
        ("192.0.2.1", "/a"),
        ("192.0.2.2", "/b"),
    ]
    assert reader.stats.samples[0][2] == "4 values; #Fields: names 5"


def test_the_time_field_may_be_named_in_every_line_format() -> None:
    """ALB's ``time`` (when the answer left) instead of ``request_creation_time``."""
    entries, _ = read(DATA / "alb.log", time_field="time")
    assert entries[0][0] == pytest.approx(1530570180.186641)
    entries, reader = read(DATA / "iis.log", time_field="nope")
    assert entries == [] and "no time field (nope" in reader.stats.samples[0][2]
