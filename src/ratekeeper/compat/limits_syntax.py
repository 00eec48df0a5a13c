"""The ``limits`` library's vocabulary, as slowapi and Flask-Limiter apps write it, read as
ratekeeper's.

- **Rate strings**: ``"5 per minute"``, ``"10/hour"``, ``"100 per 2 hours"``; several joined by
  ``;``, ``,`` or ``|`` become one stack (each rate its own counter; a request over any is
  refused, and a refused request consumes nothing in any). Units: second, minute, hour, day,
  month (30 days) and year (360 days: twelve of limits' months, not ratekeeper's 365).
- **Strategies**: ``fixed-window``, ``moving-window``, ``sliding-window-counter`` are
  ratekeeper's ``fixed_window``, ``sliding_log`` and ``sliding_window``.
- **Storage URIs**: ``memory://``, ``redis://``, ``rediss://``, ``redis+unix://``,
  ``redis+cluster://``, ``redis+sentinel://`` (and their ``async+`` forms) become a
  ``STORAGE_URI`` of ratekeeper's; ``socket_timeout`` and Sentinel's ``service_name`` are the
  storage options that carry over. Memcached, MongoDB, etcd and Valkey are refused.
- **Descriptions**: a rate as limits prints it (``"5 per 1 minute"``), for the peers' 429s.

Everything here is a pure function of its input; a value it cannot read is a ``ConfigError``
naming it and what would be accepted.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from ..errors import ConfigError
from ..rates import Rate

SECONDS = {
    "second": 1,
    "minute": 60,
    "hour": 3600,
    "day": 86_400,
    "month": 30 * 86_400,
    "year": 360 * 86_400,
}
_ONE = re.compile(r"^\s*(\d+)\s*(?:/|\s*per\s*)\s*(\d+)?\s*([a-z]+)\s*$", re.I)
_SEPARATORS = re.compile(r"[,;|]")
STRATEGIES = {
    "fixed-window": "fixed_window",
    "moving-window": "sliding_log",
    "sliding-window-counter": "sliding_window",
}
_DESCRIBED: dict[Rate, str] = {}
"""How limits prints each rate read so far (bounded by the distinct rates an app names)."""


def rates(spec: object, where: str = "limit") -> str:
    """A limits rate string as a ratekeeper rate (or stack) string."""
    if not isinstance(spec, str) or not spec.strip():
        raise ConfigError(f"{where} {spec!r} is invalid; expected a rate such as '5 per minute'")
    out = []
    for part in _SEPARATORS.split(spec):
        found = _ONE.match(part)
        unit = found.group(3).lower() if found else ""
        unit = unit[:-1] if unit.endswith("s") and unit[:-1] in SECONDS else unit
        if found is None or unit not in SECONDS:
            raise ConfigError(
                f"{where} {spec!r} is invalid at {part.strip()!r}; expected e.g. '5 per minute', "
                "'10/hour' or '100 per 2 days' (units: second, minute, hour, day, month, year), "
                "several joined by ';'"
            )
        amount, multiples = int(found.group(1)), int(found.group(2) or 1)
        if amount < 1:
            raise ConfigError(f"{where} {spec!r}: a limit of {amount} admits nothing")
        seconds = SECONDS[unit] * multiples
        ours = f"{amount}/{unit}" if multiples == 1 and unit != "year" else f"{amount}/{seconds}s"
        (rate,) = Rate.parse(ours)
        if len(_DESCRIBED) < 4096:
            _DESCRIBED.setdefault(rate, f"{amount} per {multiples} {unit}")
        out.append(ours)
    return "; ".join(out)


def describe(rate: Rate) -> str:
    """``rate`` as limits prints it (``"5 per 1 minute"``)."""
    found = _DESCRIBED.get(rate)
    if found is not None:
        return found
    for unit in ("year", "month", "day", "hour", "minute", "second"):
        if rate.period_ms % (SECONDS[unit] * 1000) == 0:
            return f"{rate.count} per {rate.period_ms // (SECONDS[unit] * 1000)} {unit}"
    return f"{rate.count} per {rate.period} second"


def strategy(name: object, where: str = "strategy") -> str | None:
    """A limits strategy name as a ratekeeper algorithm (None stays None: the default)."""
    if name is None:
        return None
    ours = STRATEGIES.get(name) if isinstance(name, str) else None
    if ours is None:
        raise ConfigError(
            f"{where} {name!r} is not supported; expected one of {', '.join(STRATEGIES)} "
            f"(ratekeeper's {', '.join(STRATEGIES.values())}; fixed-window-elastic-expiry has "
            "no equivalent: use 'fixed-window')"
        )
    return ours


def storage(
    uri: object, options: Mapping[str, Any] | None = None, where: str = "storage_uri"
) -> tuple[str, dict[str, Any]]:
    """A limits storage URI and its options as ratekeeper's ``STORAGE_URI`` and
    ``STORAGE_OPTIONS``."""
    options = dict(options or {})
    if uri is None:
        uri = "memory://"
    if not isinstance(uri, str):
        raise ConfigError(f"{where} {uri!r} is invalid; expected a URI such as 'redis://host:6379'")
    if uri.startswith("async+"):
        uri = uri[len("async+") :]
    if uri.startswith("redis+unix://"):
        uri = "unix://" + uri[len("redis+unix://") :]
    if uri.startswith(("memcached", "mongodb", "etcd", "valkey")):
        raise ConfigError(
            f"{where} {uri.split('://')[0]}:// is not supported: ratekeeper keeps its counters in "
            "memory (memory://) or on Redis (redis://, redis+cluster://, redis+sentinel://)"
        )
    service = options.pop("service_name", None)
    if service is not None:
        if not uri.startswith(("redis+sentinel://", "rediss+sentinel://")):
            raise ConfigError(f"{where}: service_name applies only to redis+sentinel:// URIs")
        uri = uri.rstrip("/") + f"/{service}"
    bad = sorted(k for k in options if k != "socket_timeout")
    if bad:
        raise ConfigError(
            f"{where} option {bad[0]!r} is not supported: put credentials and TLS options in the "
            "URI; the one storage option that carries over is socket_timeout (seconds)"
        )
    return uri, options
