"""A refused reservation as the provider would answer it: 429, its headers and its body.

The refusing level names the message: ``Rate limit reached for tokens per 1m (key-tokens) on
key k1: Limit 10000, Used 9500, Requested 2000. Please try again in 6s.`` — OpenAI's wording,
with the limit's name. A budget (a limit of a day or longer, ``limits.Rejection.budget``) is
OpenAI's ``insufficient_quota``; a request whose estimate is above the limit itself can never
pass: it says so, and ``x-should-retry: false`` (``headers.retry_headers``) stops the SDKs.
Every refusal carries the limit headers of the API (``x-ratelimit-*`` or
``anthropic-ratelimit-*``, from every level's figures as the refusal found them) and
ratekeeper's ``RateLimit-Policy``/``RateLimit``.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from ..nested import Level, NestedDecision
from .headers import anthropic_error, anthropic_headers, openai_error, openai_headers, retry_headers
from .limits import Limit, rejection, tightest


def refusal(
    provider: str,
    decision: NestedDecision,
    levels: Sequence[Level],
    used: Sequence[Limit],
    estimate: int,
) -> tuple[int, list[tuple[str, str]], bytes]:
    """The status, headers and body refusing ``decision`` in ``provider``'s format."""
    why = rejection(decision, levels, used, estimate)
    d = why.decision
    label = why.limit.label
    rate = d.rate
    kind = why.limit.counts
    never = not math.isfinite(d.retry_after)
    if never:
        wait = ""
    elif d.retry_after < 1:
        wait = f" Please try again in {max(1, math.ceil(d.retry_after * 1000))}ms."
    else:
        wait = f" Please try again in {math.ceil(d.retry_after - 1e-9)}s."
    per = f"calendar-{rate.calendar.unit}" if rate.calendar else rate.window
    subject = f"{kind} per {per} ({label}) on {why.limit.scope} {why.key}"
    if never:
        message = (f"Request too large for {subject}: Limit {d.limit}, Requested "
                   f"{why.requested}. The input or output tokens must be reduced.")  # fmt: skip
    elif why.budget:
        message = (f"You exceeded your current quota: {subject}: Limit {d.limit}, Used "
                   f"{d.used}, Requested {why.requested}.{wait}")  # fmt: skip
    else:
        message = (f"Rate limit reached for {subject}: Limit {d.limit}, Used {d.used}, "
                   f"Requested {why.requested}.{wait}")  # fmt: skip
    requests, tokens = tightest(decision, used, "requests"), tightest(decision, used, "tokens")
    if provider == "anthropic":
        body = anthropic_error(429, message)
        headers = anthropic_headers(requests, tokens)
    else:
        if why.budget:
            body = openai_error(message, "insufficient_quota", "insufficient_quota")
        else:
            body = openai_error(message, kind, "rate_limit_exceeded")
        headers = openai_headers(requests, tokens)
    headers += retry_headers(d.retry_after)
    own = d.headers(label, "tokens" if kind == "tokens" else None)
    headers += [("ratelimit-policy", own["RateLimit-Policy"]), ("ratelimit", own["RateLimit"])]
    return 429, headers, body
