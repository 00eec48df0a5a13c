"""What the providers' SDKs read: rate limit headers and error bodies in each one's format.

The OpenAI and Anthropic SDKs retry a 429 after ``retry-after-ms`` (else ``retry-after``,
seconds) and obey ``x-should-retry``; they raise a ``RateLimitError`` built from the body.
Clients that pace themselves read the ``x-ratelimit-*`` (OpenAI) or ``anthropic-ratelimit-*``
headers of every response. The gateway speaks the format of the API it serves:

- OpenAI: ``x-ratelimit-limit-requests``, ``x-ratelimit-remaining-requests``,
  ``x-ratelimit-reset-requests`` and the same for ``tokens``; resets are durations as Go
  writes them (``1s``, ``6m0s``, ``20ms``, ``1h2m3.5s``), until the limit is full again.
  Errors: ``{"error": {"message", "type", "param", "code"}}``, a rate limit's type being
  ``requests`` or ``tokens`` and its code ``rate_limit_exceeded`` (an exhausted budget:
  ``insufficient_quota``).
- Anthropic: ``anthropic-ratelimit-requests-{limit,remaining,reset}``, and for
  ``tokens``, ``input-tokens``, ``output-tokens``; resets are RFC 3339 instants (UTC, whole
  seconds, never early). The gateway counts input and output tokens against one budget, so
  the three token families carry the same figures: either kind may spend all of it. Errors:
  ``{"type": "error", "error": {"type", "message"}}``, ``rate_limit_error`` for a 429.

A 429 carries ``retry-after`` (whole seconds, rounded up), ``retry-after-ms`` (what both SDKs
read first) and ``x-should-retry``: ``false`` when the wait is past ``MAX_RETRY_WAIT`` (an
exhausted monthly budget) or the request can never pass (its estimate is above a limit), so
no SDK sleeps for days or retries what cannot succeed.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from datetime import UTC, datetime

MAX_RETRY_WAIT = 120.0
"""The longest wait a 429 asks an SDK to retry after (the OpenAI SDK's own cap)."""


@dataclass(frozen=True, slots=True)
class Figures:
    """One limit as headers show it: its size, what is left, seconds until it is full again
    and the instant it is."""

    limit: int
    remaining: int
    reset_in: float
    reset_at: float


def go_duration(seconds: float) -> str:
    """``seconds`` as Go's ``time.Duration`` prints it, to the millisecond, rounded up."""
    ms = max(0, math.ceil(seconds * 1000 - 1e-6))
    if ms == 0:
        return "0s"
    if ms < 1000:
        return f"{ms}ms"
    hours, rest = divmod(ms, 3_600_000)
    minutes, rest = divmod(rest, 60_000)
    whole, frac = divmod(rest, 1000)
    text = f"{whole}" + (f".{frac:03d}".rstrip("0") if frac else "") + "s"
    if hours:
        return f"{hours}h{minutes}m{text}"
    if minutes:
        return f"{minutes}m{text}"
    return text


def rfc3339(epoch: float) -> str:
    """``epoch`` as an RFC 3339 UTC instant, whole seconds, rounded up."""
    moment = datetime.fromtimestamp(math.ceil(epoch - 1e-6), UTC)
    return moment.strftime("%Y-%m-%dT%H:%M:%SZ")


def openai_headers(requests: Figures | None, tokens: Figures | None) -> list[tuple[str, str]]:
    """OpenAI's ``x-ratelimit-*`` headers for the tightest request and token limits."""
    out = []
    for kind, fig in (("requests", requests), ("tokens", tokens)):
        if fig is not None:
            out += [
                (f"x-ratelimit-limit-{kind}", str(fig.limit)),
                (f"x-ratelimit-remaining-{kind}", str(max(0, fig.remaining))),
                (f"x-ratelimit-reset-{kind}", go_duration(fig.reset_in)),
            ]
    return out


def anthropic_headers(requests: Figures | None, tokens: Figures | None) -> list[tuple[str, str]]:
    """Anthropic's ``anthropic-ratelimit-*`` headers (module docstring)."""
    out = []
    kinds = (("requests", requests), ("tokens", tokens), ("input-tokens", tokens),
             ("output-tokens", tokens))  # fmt: skip
    for kind, fig in kinds:
        if fig is not None:
            out += [
                (f"anthropic-ratelimit-{kind}-limit", str(fig.limit)),
                (f"anthropic-ratelimit-{kind}-remaining", str(max(0, fig.remaining))),
                (f"anthropic-ratelimit-{kind}-reset", rfc3339(fig.reset_at)),
            ]
    return out


def retry_headers(retry_after: float) -> list[tuple[str, str]]:
    """``retry-after``, ``retry-after-ms`` and ``x-should-retry`` for a 429 (module doc)."""
    if not math.isfinite(retry_after) or retry_after > MAX_RETRY_WAIT:
        out = [("x-should-retry", "false")]
        if math.isfinite(retry_after):
            out.append(("retry-after", str(max(1, math.ceil(retry_after - 1e-9)))))
        return out
    return [
        ("retry-after", str(max(1, math.ceil(retry_after - 1e-9)))),
        ("retry-after-ms", str(max(1, math.ceil(retry_after * 1000 - 1e-6)))),
        ("x-should-retry", "true"),
    ]


_ANTHROPIC_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    413: "request_too_large",
    429: "rate_limit_error",
    500: "api_error",
    502: "api_error",
    503: "api_error",
    504: "api_error",
}


def openai_error(
    message: str, kind: str, code: str | None = None, param: str | None = None
) -> bytes:
    """An OpenAI error body: ``{"error": {"message", "type", "param", "code"}}``."""
    error = {"message": message, "type": kind, "param": param, "code": code}
    return json.dumps({"error": error}).encode()


def anthropic_error(status: int, message: str) -> bytes:
    """An Anthropic error body: ``{"type": "error", "error": {"type", "message"}}``."""
    kind = _ANTHROPIC_TYPES.get(status, "api_error")
    return json.dumps({"type": "error", "error": {"type": kind, "message": message}}).encode()


_OPENAI_TYPES = {
    400: ("invalid_request_error", None),
    401: ("invalid_request_error", "invalid_api_key"),
    404: ("invalid_request_error", "unknown_url"),
    413: ("invalid_request_error", "request_too_large"),
    500: ("server_error", None),
    502: ("server_error", "upstream_error"),
    503: ("server_error", "upstream_error"),
    504: ("server_error", "upstream_timeout"),
}


def error_body(provider: str, status: int, message: str, param: str | None = None) -> bytes:
    """The body of a gateway error other than a rate limit, in ``provider``'s format."""
    if provider == "anthropic":
        return anthropic_error(status, message)
    kind, code = _OPENAI_TYPES.get(status, ("server_error", None))
    return openai_error(message, kind, code, param)
