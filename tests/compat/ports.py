"""The sample apps of docs/migrating.md (and the peers' other quick starts), as source: ours as
written, and the peer's made by changing its imports back — the one change a port makes.

``sample(heading, n)`` is the n-th python block under a heading of the page, cut at its
``# --- try it`` line (the app alone). ``peer_source`` rewrites its imports from
``ratekeeper.compat.<peer>`` into the peer's own modules; ``on_redis`` points either at a Redis.
"""

from __future__ import annotations

import re
import textwrap
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PAGE = ROOT / "docs" / "migrating.md"
MARK = "# --- try it"

PEER_MODULES = {
    "slowapi": {
        "Limiter": "slowapi",
        "_rate_limit_exceeded_handler": "slowapi",
        "get_remote_address": "slowapi.util",
        "get_ipaddr": "slowapi.util",
        "RateLimitExceeded": "slowapi.errors",
        "SlowAPIMiddleware": "slowapi.middleware",
        "SlowAPIASGIMiddleware": "slowapi.middleware",
    },
    "flask_limiter": {
        "Limiter": "flask_limiter",
        "RateLimitExceeded": "flask_limiter",
        "Limit": "flask_limiter",
        "ApplicationLimit": "flask_limiter",
        "ExemptionScope": "flask_limiter",
        "get_remote_address": "flask_limiter.util",
    },
    "django_ratelimit": {
        "ratelimit": "django_ratelimit.decorators",
        "Ratelimited": "django_ratelimit.exceptions",
        "is_ratelimited": "django_ratelimit.core",
        "get_usage": "django_ratelimit.core",
        "ALL": "django_ratelimit",
        "UNSAFE": "django_ratelimit",
        "RatelimitMiddleware": "django_ratelimit.middleware",
    },
    "drf": {
        "SimpleRateThrottle": "rest_framework.throttling",
        "AnonRateThrottle": "rest_framework.throttling",
        "UserRateThrottle": "rest_framework.throttling",
        "ScopedRateThrottle": "rest_framework.throttling",
    },
}
_IMPORT = re.compile(
    r"^from ratekeeper\.compat\.(\w+) import (\((?:.|\n)*?\)|[^\n]*)(?P<tail>[^\n]*)$", re.M
)


def sample(heading: str, index: int = 0) -> str:
    """The ``index``-th python block under ``## heading``, up to its ``# --- try it`` line."""
    text = PAGE.read_text()
    start = text.index(f"## {heading}\n")
    end = text.find("\n## ", start + 1)
    section = text[start : end if end != -1 else None]
    blocks = re.findall(r"^```python\n(.*?)^```", section, re.S | re.M)
    block = textwrap.dedent(blocks[index])
    return block.split(MARK)[0]


def peer_source(source: str) -> str:
    """``source`` with ``ratekeeper.compat`` imports replaced by the peer's own."""

    def swap(found: re.Match[str]) -> str:
        peer, names = found.group(1), found.group(2)
        modules = PEER_MODULES[peer]
        names = " ".join(line.split("#")[0] for line in names.strip("()").splitlines())
        listed = [n.strip() for n in names.split(",") if n.strip()]
        lines = [f"from {modules[name]} import {name}{found.group('tail')}" for name in listed]
        return "\n".join(lines)

    out = _IMPORT.sub(swap, source)
    return out.replace("ratekeeper.compat.drf.", "rest_framework.throttling.").replace(
        "ratekeeper.compat.django_ratelimit.", "django_ratelimit.middleware."
    )


def replace_once(source: str, old: str, new: str) -> str:
    """``source`` with ``old`` (which must be there) replaced by ``new``."""
    assert old in source, f"{old!r} is not in the sample"
    return source.replace(old, new, 1)


def on_redis(source: str, peer: str, url: str) -> str:
    """``source`` storing its counters on the Redis at ``url`` (under the peer or ours)."""
    timeout = '{"socket_timeout": 5}'
    if peer == "slowapi":
        return replace_once(
            source,
            "Limiter(key_func=get_remote_address",
            f'Limiter(storage_uri="{url}", storage_options={timeout}, key_func=get_remote_address',
        )
    if peer == "flask_limiter":
        return replace_once(
            source,
            'storage_uri="memory://",',
            f'storage_uri="{url}", storage_options={timeout},',
        )
    backend = "django.core.cache.backends.redis.RedisCache"
    cache = f'{{"default": {{"BACKEND": "{backend}", "LOCATION": "{url}"}}}}'
    ours = f'{{"STORAGE_URI": "{url}", "STORAGE_OPTIONS": {timeout}}}'
    return replace_once(
        source, "settings.configure(", f"settings.configure(CACHES={cache}, RATEKEEPER={ours}, "
    )


def without_imports(source: str) -> str:
    """``source`` with its import statements taken out (what a port must leave as it was)."""
    return re.sub(r"^(from|import) [^\n(]*(\((?:.|\n)*?\))?[^\n]*\n", "", source, flags=re.M)
