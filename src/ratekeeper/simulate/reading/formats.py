"""Log formats read a line at a time, and telling a log's format from a sample of its lines.

Every format yields a request's fields under its own names and under the names key functions
read in every format — ``ip``, ``user``, ``method``, ``path``, ``status`` (``user_agent`` when
it has one) — and the text of its time. ``parse(line)`` returns ``(fields, time text)``,
``None`` for a line that is not a request by design (a W3C directive, a CSV header), or
raises ``Bad`` saying why the line is not one.

- ``w3c``: W3C extended logs, their columns named by the last ``#Fields:`` directive (IIS
  writes a new one when it restarts; every other ``#`` line is a directive too). Values are
  separated by spaces (IIS) or tabs (CloudFront); the time is ``date`` and ``time``, UTC. Shown
  as ``iis`` or ``cloudfront`` when the directives or columns say which.
- ``alb``: AWS Application Load Balancer access logs (space-separated, some fields quoted). The
  time is ``request_creation_time`` (when the request arrived; ``time`` is when the answer
  left), the key ``client:port`` without the port.
- ``csv``: a header line naming the columns, then one request per line.
- JSON lines and its presets (``caddy``, ``traefik-json``, ``cloudflare``): ``jsonlog``.

The common log format family (``combined``, ``common``, ``traefik``'s CLF) is parsed a block
of lines at a time by ``combined``; ``detect`` tells it apart from the others here too.

``detect(sample)`` tries every format on the same lines (the first ``SAMPLE`` that are not
blank) and keeps the one that makes most of them requests with a time; ties go to the more
specific format (a JSON server preset wins over plain JSON lines when it reads at least
half of what they read: a server's log holds lines of its own that are not requests).
"""

from __future__ import annotations

import csv
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Protocol

from . import jsonlog
from .combined import LINE as COMBINED_LINE
from .jsonlog import KNOWN_ALIASES, TIME_FIELDS, Bad
from .times import TimeParser

PRESET_NAMES = frozenset(p.name for p in jsonlog.PRESETS if p.name != "jsonl")
SAMPLE = 200
"""Lines a format is detected from."""
COMBINED_FAMILY = ("combined", "common", "traefik")
W3C_NAMES = {
    "c-ip": "ip",
    "cs-method": "method",
    "cs-uri-stem": "path",
    "sc-status": "status",
    "cs-username": "user",
    "cs(User-Agent)": "user_agent",
}
ALB_COLUMNS = (
    "type", "time", "elb", "client:port", "target:port", "request_processing_time",
    "target_processing_time", "response_processing_time", "elb_status_code",
    "target_status_code", "received_bytes", "sent_bytes", "request", "user_agent",
    "ssl_cipher", "ssl_protocol", "target_group_arn", "trace_id", "domain_name",
    "chosen_cert_arn", "matched_rule_priority", "request_creation_time", "actions_executed",
    "redirect_url", "error_reason", "target:port_list", "target_status_code_list",
    "classification", "classification_reason", "conn_trace_id",
)  # fmt: skip
"""The fields of an ALB access log entry, in order (AWS: "Access log entries")."""
ALB_TYPES = frozenset({"http", "https", "h2", "grpcs", "ws", "wss"})
ALB_TOKEN = re.compile(r'"((?:[^"\\]|\\.)*)"|(\S+)')
TRAEFIK_TAIL = re.compile(r'" \d+ "[^"]*" "[^"]*" \d+ms\s*$')


class LineFormat(Protocol):
    """A format read a line at a time (see the module docstring)."""

    name: str

    def parse(self, line: str) -> tuple[dict[str, str], str | None] | None: ...


class W3C:
    """W3C extended log format (IIS, CloudFront)."""

    def __init__(self, name: str = "w3c") -> None:
        self.name = name
        self.columns: list[str] = []

    def parse(self, line: str) -> tuple[dict[str, str], str | None] | None:
        if line.startswith("#"):
            if line.startswith("#Fields:"):
                self.columns = line[len("#Fields:") :].split()
            return None
        if not self.columns:
            raise Bad("no #Fields: directive before it")
        values = line.rstrip("\r").split("\t") if "\t" in line else line.split()
        if len(values) != len(self.columns):
            raise Bad(f"{len(values)} values; #Fields: names {len(self.columns)}")
        fields = dict(zip(self.columns, values, strict=True))
        for source, name in W3C_NAMES.items():
            value = fields.get(source)
            if value is not None and value != "-":
                fields[name] = value
        date, time = fields.get("date"), fields.get("time")
        return fields, f"{date} {time}" if date and time else None


class ALB:
    """AWS Application Load Balancer access logs."""

    name = "alb"

    def parse(self, line: str) -> tuple[dict[str, str], str | None] | None:
        values = [q if u == "" else u for q, u in ALB_TOKEN.findall(line)]
        if len(values) < 13 or values[0] not in ALB_TYPES:
            raise Bad("not an ALB access log entry (type time elb client:port ... request)")
        fields = dict(zip(ALB_COLUMNS, values, strict=False))
        client = fields["client:port"]
        fields["ip"] = client.rsplit(":", 1)[0] if ":" in client else client
        fields["status"] = fields["elb_status_code"]
        method, _, rest = fields["request"].partition(" ")
        url, _, protocol = rest.rpartition(" ")
        fields["method"] = method
        fields["path"] = _path_of(url or rest)
        fields["protocol"] = protocol
        when = fields.get("request_creation_time", "-")
        return fields, fields["time"] if when == "-" else when


def _path_of(url: str) -> str:
    """The path (and query) of an absolute URL, ``http://host:80/a?b`` -> ``/a?b``."""
    scheme = url.find("://")
    if scheme < 0:
        return url
    slash = url.find("/", scheme + 3)
    return url[slash:] if slash >= 0 else "/"


class CSV:
    """CSV with a header line."""

    name = "csv"

    def __init__(self, time_field: str | None = None) -> None:
        self.header: list[str] | None = None
        self.time_field = time_field

    def parse(self, line: str) -> tuple[dict[str, str], str | None] | None:
        try:
            row = next(csv.reader([line]))
        except csv.Error as exc:
            raise Bad(f"not CSV: {exc}") from None
        if self.header is None:
            self.header = row
            return None
        if len(row) != len(self.header):
            raise Bad(f"{len(row)} columns; the header has {len(self.header)}")
        fields = dict(zip(self.header, row, strict=True))
        _known(fields)
        name = self.time_field or next((f for f in TIME_FIELDS if f in fields), None)
        return fields, None if name is None else fields.get(name)


class JSON:
    """JSON lines, with a preset saying where a server keeps its fields."""

    def __init__(self, preset: str = "jsonl", time_field: str | None = None) -> None:
        self.preset = jsonlog.BY_NAME[preset]
        self.name = preset
        self.time_field = time_field

    def parse(self, line: str) -> tuple[dict[str, str], str | None] | None:
        fields = jsonlog.parse(line)
        preset = self.preset
        if preset.requires is not None and preset.requires not in fields:
            raise Bad(f"not a {preset.name} access entry (no {preset.requires})")
        jsonlog.normalise(fields, preset)
        name = self.time_field or jsonlog.time_field(fields, preset)
        return fields, None if name is None else fields.get(name)


def _known(fields: dict[str, str]) -> None:
    """The normalised names from common spellings of a CSV's columns."""
    for name, spellings in KNOWN_ALIASES.items():
        if name not in fields:
            for s in spellings:
                value = fields.get(s)
                if value:
                    fields[name] = value
                    break


def line_format(name: str, time_field: str | None) -> LineFormat:
    """A fresh parser of the format ``name`` (not of the combined family)."""
    if name in ("w3c", "iis", "cloudfront"):
        return W3C(name)
    if name == "alb":
        return ALB()
    if name == "csv":
        return CSV(time_field)
    return JSON(name, time_field)


LINE_FORMATS = ("w3c", "iis", "cloudfront", "alb", "csv", *jsonlog.BY_NAME)
FORMATS = ("auto", *COMBINED_FAMILY, *LINE_FORMATS)


@dataclass(frozen=True, slots=True)
class Detected:
    """What ``detect`` found: the format and how many of the sample's lines it read."""

    name: str
    matched: int
    lines: int

    def __str__(self) -> str:
        if self.matched < 0:
            return f"{self.name} (given)"
        return f"{self.name} ({self.matched} of {self.lines} sample lines)"


def detect(sample: Sequence[str], time_field: str | None = None) -> Detected:
    """The format that reads most of ``sample`` (lines that are not blank) as requests."""
    best = Detected("none", 0, len(sample))
    tries = _tries(sample, time_field)
    generic = next(t for t in tries if t[0] == "jsonl")
    for name, matched, lines in tries:
        if name == "jsonl" and any(
            t[1] * 2 >= generic[1] > 0 for t in tries if t[0] in PRESET_NAMES
        ):
            continue  # a server's preset reads most of what any JSON reading does: its log
        if matched > best.matched:
            best = Detected(name, matched, lines)
    return best


def _tries(sample: Sequence[str], time_field: str | None) -> list[tuple[str, int, int]]:
    """(format, requests read, request lines of the sample) per format, most specific first."""
    out = [_combined(sample)]
    w3c = W3C()
    counted = _count(w3c.parse, sample)
    out.append((_w3c_name(sample, w3c.columns), *counted))
    out.append(("alb", *_count(ALB().parse, sample)))
    for preset in jsonlog.PRESETS:
        out.append((preset.name, *_count(JSON(preset.name, time_field).parse, sample)))
    out.append(("csv", *_count(CSV(time_field).parse, sample)))
    return out


def _count(
    parse: Callable[[str], tuple[dict[str, str], str | None] | None], sample: Sequence[str]
) -> tuple[int, int]:
    """Requests with a time ``parse`` reads from ``sample``, and the lines it takes for
    requests (all but directives and headers)."""
    times = TimeParser()
    matched = lines = 0
    for line in sample:
        try:
            got = parse(line)
        except Bad:
            lines += 1
            continue
        if got is None:
            continue
        lines += 1
        if got[1] is not None:
            try:
                times(got[1])
            except ValueError:
                continue
            matched += 1
    return matched, lines


def _combined(sample: Sequence[str]) -> tuple[str, int, int]:
    """The common log format family: ``traefik`` when most lines carry Traefik's fields after
    the combined ones, ``combined`` when most carry a referer and user agent, else
    ``common``."""
    times = TimeParser()
    matched = tails = traefik = 0
    for line in sample:
        m = COMBINED_LINE.match(line)
        if m is None:
            continue
        try:
            times(m.group(3))
        except ValueError:
            continue
        matched += 1
        if m.group(9) is not None:
            tails += 1
            traefik += TRAEFIK_TAIL.search(line) is not None
    name = "traefik" if traefik * 2 > matched else "combined" if tails * 2 > matched else "common"
    return name, matched, len(sample)


def _w3c_name(sample: Sequence[str], columns: Sequence[str]) -> str:
    if any(c.startswith("x-edge-") for c in columns):
        return "cloudfront"
    if any("Internet Information Services" in line for line in sample if line[:1] == "#"):
        return "iis"
    if "s-sitename" in columns or "sc-win32-status" in columns:
        return "iis"
    return "w3c"
