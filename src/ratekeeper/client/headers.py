"""What a response says about the client's quotas: every header family, read into one shape.

``read(headers, now)`` returns an ``Observation``: the quotas the response states (``Quota``:
limit, window, remaining, seconds until reset, unit) and its ``Retry-After``. Families, the
first that a response carries wins (a server that sends several says the same in each):

1. IETF ``RateLimit-Policy`` / ``RateLimit`` (draft-ietf-httpapi-ratelimit-headers,
   structured fields): policy items ``"name";q=100;w=60;qu="requests";pk=:...:``, and the
   deciding item ``"name";r=42;t=30;pk=:...:``, joined by name and partition key (``pk``);
   the earlier drafts' ``RateLimit-Limit`` / ``-Remaining`` / ``-Reset`` (seconds) too;
2. OpenAI's ``x-ratelimit-{limit,remaining,reset}-{requests,tokens}``, resets as Go
   durations (``6m0s``, ``1s``, ``20ms``);
3. Anthropic's ``anthropic-ratelimit-{requests,tokens,input-tokens,output-tokens}-
   {limit,remaining,reset}``, resets as RFC 3339 instants;
4. ``X-RateLimit-Limit`` / ``-Remaining`` / ``-Reset`` (GitHub, and most others): a reset
   above 10⁹ is an epoch (seconds; above 10¹² milliseconds), anything less is seconds from
   now; ``X-RateLimit-Resource`` names the quota (GitHub's ``core``, ``search``).

``Retry-After`` (seconds, or an HTTP date) is read whatever the family. Hostile input is never
an exception: a value that does not parse, is negative, not finite or out of range is dropped
(``remaining`` above ``limit`` is cut to it), and a response left with nothing says nothing:
the pacer then reacts (``Retry-After``, 429) instead of pacing.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from email.utils import parsedate_to_datetime

from .structured import Bare, parse_list

MAX_UNITS = 10**15
"""A limit or remaining above this is dropped (no real quota is that large)."""
MAX_SECONDS = 10**8
"""A window or reset further than this (about three years) is dropped."""
EPOCH_SECONDS = 1e9
"""An ``X-RateLimit-Reset`` at or above this is an epoch in seconds (2001-09-09)."""
EPOCH_MS = 1e12
"""... and at or above this an epoch in milliseconds."""


@dataclass(frozen=True, slots=True)
class Quota:
    """One quota as one response states it; ``None`` where the response does not say.

    ``name`` identifies it within its server and partition (a policy's name, ``requests``,
    ``tokens``); ``unit`` is what it counts (``requests``, ``tokens``, ``content-bytes``, ...);
    ``reset_seconds`` is from the response's arrival; ``partition`` is the server's partition
    key (IETF ``pk``, base64) when it sent one; ``refills``: the quota is a bucket refilled
    at a steady rate and the reset is when it is full again (OpenAI, Anthropic), not a
    window's end.
    """

    name: str
    unit: str = "requests"
    limit: int | None = None
    window_seconds: float | None = None
    remaining: int | None = None
    reset_seconds: float | None = None
    partition: str | None = None
    refills: bool = False


@dataclass(frozen=True, slots=True)
class Observation:
    """What one response says: its quotas, its ``Retry-After`` (seconds from its arrival) and
    the header family it was read from (``ietf``, ``openai``, ``anthropic``, ``x-ratelimit`` or
    ``none``)."""

    quotas: tuple[Quota, ...] = ()
    retry_after_seconds: float | None = None
    family: str = "none"


def header_map(pairs: Iterable[tuple[str, str]]) -> dict[str, str]:
    """Header pairs -> a dict by lower-case name; repeated fields joined with ``, `` (RFC 9110
    5.3), as the structured fields expect."""
    out: dict[str, str] = {}
    for name, value in pairs:
        key = name.lower()
        out[key] = f"{out[key]}, {value}" if key in out else value
    return out


def read(headers: Mapping[str, str], now: float) -> Observation:
    """The observation of a response whose headers (``header_map``) arrived at ``now`` (epoch
    seconds). Never raises."""
    try:
        retry = retry_after(headers.get("retry-after"), now)
        for family, reader in _FAMILIES:
            quotas = reader(headers, now)
            if quotas:
                return Observation(quotas, retry, family)
        return Observation((), retry, "none")
    except Exception:  # a parser bug must not break the caller's request: react instead
        return Observation()


# --- values -----------------------------------------------------------------------------------

_DECIMAL = re.compile(r"[0-9]{1,20}(\.[0-9]{1,9})?")
_DURATION_PART = re.compile(r"([0-9]{1,12}(?:\.[0-9]{1,9})?)(ms|us|µs|ns|h|m|s|d)")
_DURATION_UNITS = {"d": 86400.0, "h": 3600.0, "m": 60.0, "s": 1.0, "ms": 1e-3, "us": 1e-6}
_DURATION_UNITS.update({"µs": 1e-6, "ns": 1e-9})


def units(text: str | None) -> int | None:
    """A count of units (``"5000"``; the first of a repeated field), or None."""
    if text is None:
        return None
    text = text.split(",")[0].strip()
    if not _DECIMAL.fullmatch(text) or "." in text:
        return None
    value = int(text)
    return value if value <= MAX_UNITS else None


def seconds(text: str | None) -> float | None:
    """A non-negative number of seconds (``"30"``, ``"0.5"``), or None."""
    if text is None:
        return None
    text = text.split(",")[0].strip()
    if not _DECIMAL.fullmatch(text):
        return None
    return _bounded(float(text))


def duration(text: str | None) -> float | None:
    """A Go duration as OpenAI sends it (``6m0s``, ``1s``, ``20ms``, ``1h2m3.5s``; a bare
    number is seconds) in seconds, or None."""
    if text is None:
        return None
    text = text.strip()
    if _DECIMAL.fullmatch(text):
        return _bounded(float(text))
    if not text or len(text) > 64:
        return None
    total, pos = 0.0, 0
    for match in _DURATION_PART.finditer(text):
        if match.start() != pos:
            return None
        total += float(match.group(1)) * _DURATION_UNITS[match.group(2)]
        pos = match.end()
    return _bounded(total) if pos == len(text) else None


def instant(text: str | None, now: float) -> float | None:
    """Seconds from ``now`` until an RFC 3339 instant (``2024-06-01T12:00:00Z``; a past one
    is 0), or None."""
    if text is None or len(text) > 64:
        return None
    try:
        when = datetime.fromisoformat(text.strip())
    except ValueError:
        return None
    if when.tzinfo is None:
        when = when.replace(tzinfo=UTC)
    return _bounded(max(0.0, when.timestamp() - now))


def retry_after(text: str | None, now: float) -> float | None:
    """``Retry-After`` in seconds from ``now``: delay-seconds or an HTTP date (RFC 9110
    10.2.3; a past date is 0), or None."""
    if text is None:
        return None
    delay = seconds(text)
    if delay is not None or len(text) > 64:
        return delay
    try:
        when = parsedate_to_datetime(text.strip())
    except (TypeError, ValueError, IndexError, OverflowError):
        return None
    if when.tzinfo is None:
        when = when.replace(tzinfo=UTC)
    return _bounded(max(0.0, when.timestamp() - now))


def reset_value(text: str | None, now: float) -> float | None:
    """An ``X-RateLimit-Reset``: epoch seconds (GitHub), epoch milliseconds, or seconds from
    now (told apart by size: ``EPOCH_SECONDS``, ``EPOCH_MS``), as seconds from ``now``."""
    if text is None:
        return None
    text = text.split(",")[0].strip()
    if not _DECIMAL.fullmatch(text):
        return None
    value = float(text)
    if value >= EPOCH_MS:
        return _bounded(max(0.0, value / 1000 - now))
    if value >= EPOCH_SECONDS:
        return _bounded(max(0.0, value - now))
    return value


def _bounded(value: float) -> float | None:
    return value if math.isfinite(value) and 0 <= value <= MAX_SECONDS else None


def _quota(
    name: str,
    unit: str,
    limit: int | None,
    window: float | None,
    remaining: int | None,
    reset: float | None,
    partition: str | None = None,
    refills: bool = False,
) -> Quota | None:
    """A ``Quota`` made consistent (remaining cut to limit; a zero window dropped), or None
    when it says nothing."""
    if limit is not None and remaining is not None and remaining > limit:
        remaining = limit
    if window is not None and window <= 0:
        window = None
    if limit is None and remaining is None:
        return None
    return Quota(name, unit, limit, window, remaining, reset, partition, refills)


# --- the families -----------------------------------------------------------------------------


def _sf_units(value: Bare | None) -> int | None:
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= MAX_UNITS:
        return None
    return value


def _sf_seconds(value: Bare | None) -> float | None:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return _bounded(float(value))


def _sf_partition(value: Bare | None) -> str | None:
    if isinstance(value, bytes):
        return value.hex()
    return None


def _ietf(headers: Mapping[str, str], now: float) -> tuple[Quota, ...]:
    policies = parse_list(headers.get("ratelimit-policy")) or []
    current = parse_list(headers.get("ratelimit")) or []
    stated: dict[tuple[str, str | None], dict[str, Bare]] = {}
    for value, params in policies[:16]:
        if isinstance(value, str):
            stated[(value, _sf_partition(params.get("pk")))] = dict(params)
    for value, params in current[:16]:
        if isinstance(value, str):
            key = (value, _sf_partition(params.get("pk")))
            stated.setdefault(key, {}).update({k: v for k, v in params.items() if k in ("r", "t")})
    out = []
    for (name, partition), params in stated.items():
        unit = params.get("qu")
        quota = _quota(
            name,
            unit if isinstance(unit, str) and unit else "requests",
            _sf_units(params.get("q")),
            _sf_seconds(params.get("w")),
            _sf_units(params.get("r")),
            _sf_seconds(params.get("t")),
            partition,
        )
        if quota is not None:
            out.append(quota)
    if not out:  # drafts 03 to 06: RateLimit-Limit / -Remaining / -Reset (seconds)
        limit = units(headers.get("ratelimit-limit"))
        remaining = units(headers.get("ratelimit-remaining"))
        reset = seconds(headers.get("ratelimit-reset"))
        quota = _quota("ratelimit", "requests", limit, None, remaining, reset)
        out = [] if quota is None else [quota]
    return tuple(out)


def _openai(headers: Mapping[str, str], now: float) -> tuple[Quota, ...]:
    out = []
    for unit in ("requests", "tokens"):
        quota = _quota(
            unit,
            unit,
            units(headers.get(f"x-ratelimit-limit-{unit}")),
            None,
            units(headers.get(f"x-ratelimit-remaining-{unit}")),
            duration(headers.get(f"x-ratelimit-reset-{unit}")),
            refills=True,
        )
        if quota is not None:
            out.append(quota)
    return tuple(out)


def _anthropic(headers: Mapping[str, str], now: float) -> tuple[Quota, ...]:
    out = []
    for name in ("requests", "tokens", "input-tokens", "output-tokens"):
        prefix = f"anthropic-ratelimit-{name}"
        quota = _quota(
            name,
            "requests" if name == "requests" else "tokens",
            units(headers.get(f"{prefix}-limit")),
            None,
            units(headers.get(f"{prefix}-remaining")),
            instant(headers.get(f"{prefix}-reset"), now),
            refills=True,
        )
        if quota is not None:
            out.append(quota)
    return tuple(out)


def _x_ratelimit(headers: Mapping[str, str], now: float) -> tuple[Quota, ...]:
    resource = headers.get("x-ratelimit-resource", "").strip()
    reset = reset_value(headers.get("x-ratelimit-reset"), now)
    if reset is None:  # Discord's -Reset-After: seconds
        reset = seconds(headers.get("x-ratelimit-reset-after"))
    quota = _quota(
        resource[:64] if resource.isascii() and resource.isprintable() and resource else "default",
        "requests",
        units(headers.get("x-ratelimit-limit")),
        None,
        units(headers.get("x-ratelimit-remaining")),
        reset,
    )
    return () if quota is None else (quota,)


_FAMILIES = (
    ("ietf", _ietf),
    ("openai", _openai),
    ("anthropic", _anthropic),
    ("x-ratelimit", _x_ratelimit),
)
