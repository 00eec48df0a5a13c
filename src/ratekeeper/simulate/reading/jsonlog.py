"""JSON-lines logs: one object per line, nested fields named by dotted paths.

``flatten`` turns ``{"request": {"remote_ip": "1.2.3.4", "headers": {"User-Agent":
["curl/8"]}}}`` into ``{"request.remote_ip": "1.2.3.4", "request.headers.User-Agent":
"curl/8"}``: every field a key function, ``--field`` or ``--time-field`` may name, as text. A
list of plain values reads as its items joined by ``", "`` (as HTTP joins a repeated header);
``true``/``false``/``null`` as JSON spells them. Nesting is capped (``MAX_DEPTH`` levels): a
deeper line is a bad line, counted, not a ``RecursionError`` (Python's parser is asked only
for what its recursion allows; a line past that is bad too).

Presets name where a server's log keeps the fields every format yields (``ip``, ``user``,
``method``, ``path``, ``status``) and its time:

- ``caddy``: Caddy's ``http.log.access`` entries (``ts`` epoch seconds, ``request.client_ip``
  or ``request.remote_ip``, ``request.method``, ``request.uri``, ``status``, ``user_id``);
- ``traefik-json``: Traefik's JSON access log (``StartUTC``, ``ClientHost``,
  ``RequestMethod``, ``RequestPath``, ``DownstreamStatus``, ``ClientUsername``);
- ``cloudflare``: Cloudflare Logpush HTTP requests (``EdgeStartTimestamp`` in nanoseconds,
  RFC 3339 or seconds; ``ClientIP``, ``ClientRequestMethod``, ``ClientRequestURI``,
  ``EdgeResponseStatus``);
- ``jsonl``: anything else: common spellings (``remote_addr``, ``uri``, ...) and the first of
  ``time``, ``timestamp``, ``ts``, ``@timestamp``, ... found.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

MAX_DEPTH = 16
"""Deepest nesting of a line's objects and lists (real logs nest three or four levels)."""
TIME_FIELDS = (
    "time", "timestamp", "ts", "@timestamp", "time_iso8601", "time_local", "msec", "date",
    "datetime",
)  # fmt: skip
"""Where a JSON line's time is looked for, in order (nginx's ``$time_iso8601``,
``$time_local`` and ``$msec`` among them)."""
KNOWN_ALIASES: dict[str, tuple[str, ...]] = {
    "ip": ("ip", "remote_addr", "client_ip", "client", "remote_ip", "clientip", "peer",
           "client_addr", "remote_address", "source.ip", "client.ip"),
    "user": ("user", "remote_user", "username", "user_id", "user.name"),
    "method": ("method", "request_method", "verb", "http.request.method"),
    "path": ("path", "uri", "request_uri", "url", "request_path", "url.path"),
    "status": ("status", "status_code", "response_code", "http.response.status_code"),
}  # fmt: skip
"""Common spellings, Elastic Common Schema's dotted names among them."""


class Bad(ValueError):
    """A line that is not a request: the message says why."""


@dataclass(frozen=True, slots=True)
class Preset:
    """Where one kind of JSON log keeps its fields: normalised name -> the paths to try."""

    name: str
    fields: Mapping[str, tuple[str, ...]]
    time: tuple[str, ...]
    requires: str | None = None
    """A path every access entry has (other lines of the log are not requests)."""


PRESETS = (
    Preset(
        "caddy",
        {
            "ip": ("request.client_ip", "request.remote_ip"),
            "method": ("request.method",),
            "path": ("request.uri",),
            "status": ("status",),
            "user": ("user_id",),
            "user_agent": ("request.headers.User-Agent",),
        },
        ("ts",),
        "request.method",
    ),
    Preset(
        "traefik-json",
        {
            "ip": ("ClientHost",),
            "method": ("RequestMethod",),
            "path": ("RequestPath",),
            "status": ("DownstreamStatus",),
            "user": ("ClientUsername",),
            "user_agent": ("request_User-Agent",),
        },
        ("StartUTC", "time"),
        "RequestMethod",
    ),
    Preset(
        "cloudflare",
        {
            "ip": ("ClientIP",),
            "method": ("ClientRequestMethod",),
            "path": ("ClientRequestURI", "ClientRequestPath"),
            "status": ("EdgeResponseStatus",),
            "user_agent": ("ClientRequestUserAgent",),
        },
        ("EdgeStartTimestamp",),
        "ClientIP",
    ),
    Preset("jsonl", KNOWN_ALIASES, TIME_FIELDS),
)
BY_NAME = {p.name: p for p in PRESETS}


def parse(line: str) -> dict[str, str]:
    """One JSON line's fields, flattened; ``Bad`` says why a line is not one."""
    try:
        obj = json.loads(line)
    except RecursionError:  # deeper than the interpreter's recursion limit
        raise Bad(f"nested deeper than {MAX_DEPTH} levels") from None
    except ValueError as exc:
        raise Bad(f"not JSON: {exc}") from None
    if not isinstance(obj, dict):
        raise Bad("not a JSON object")
    out: dict[str, str] = {}
    _flatten(obj, "", out, 1)
    return out


def _flatten(obj: dict[str, Any], prefix: str, out: dict[str, str], depth: int) -> None:
    if depth > MAX_DEPTH:
        raise Bad(f"nested deeper than {MAX_DEPTH} levels")
    for k, v in obj.items():
        name = prefix + k
        if isinstance(v, dict):
            _flatten(v, name + ".", out, depth + 1)
        elif isinstance(v, list):
            if all(not isinstance(x, dict | list) for x in v):
                out[name] = ", ".join(_text(x) for x in v)
            else:
                _check_depth(v, depth + 1)
                out[name] = json.dumps(v)
        else:
            out[name] = _text(v)


def _check_depth(value: list[Any], depth: int) -> None:
    """``Bad`` if ``value`` nests past ``MAX_DEPTH`` (iterative: no recursion to exhaust)."""
    stack: list[tuple[Any, int]] = [(value, depth)]
    while stack:
        item, d = stack.pop()
        if d > MAX_DEPTH:
            raise Bad(f"nested deeper than {MAX_DEPTH} levels")
        children = item.values() if isinstance(item, dict) else item
        stack.extend((c, d + 1) for c in children if isinstance(c, dict | list))


def _text(value: Any) -> str:
    if isinstance(value, str):
        return value
    if isinstance(value, bool) or value is None:
        return json.dumps(value)
    return str(value)


def normalise(fields: dict[str, str], preset: Preset) -> None:
    """Add the normalised names (``ip``, ``path``, ...) the preset finds, in place."""
    for name, paths in preset.fields.items():
        if name in fields and preset.name == "jsonl":
            continue
        for path in paths:
            value = fields.get(path)
            if value is not None and value != "":
                fields[name] = value
                break
    if fields.get("user") in ("-", ""):
        del fields["user"]


def time_field(fields: Mapping[str, str], preset: Preset) -> str | None:
    """The first of the preset's time paths present in ``fields``."""
    for path in preset.time:
        if path in fields:
            return path
    return None
