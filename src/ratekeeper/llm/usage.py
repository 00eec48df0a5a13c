"""Token usage as the provider reports it: ``TokenUsage`` and the readers of each format.

A provider's answer says what a call used (what it bills), and that is what the gateway
settles with. The formats:

- OpenAI chat completions, completions and embeddings: ``usage.prompt_tokens``,
  ``completion_tokens`` (absent for embeddings), ``total_tokens``,
  ``prompt_tokens_details.cached_tokens``, ``completion_tokens_details.reasoning_tokens``;
- OpenAI's responses API: ``usage.input_tokens``, ``output_tokens``, ``total_tokens``,
  ``input_tokens_details.cached_tokens``, ``output_tokens_details.reasoning_tokens``;
- Anthropic messages: ``usage.input_tokens`` (the uncached part), ``output_tokens``,
  ``cache_creation_input_tokens``, ``cache_read_input_tokens``; its total is their sum.

A figure is a JSON integer from 0 to ``MAX_REPORTED`` (not a float, not ``true``): anything
else — negative, fractional, a string, a number past any model's context — makes the whole
usage invalid (``UsageError``), so the gateway keeps its estimate rather than charging a
figure it cannot trust. A total below its parts is invalid too. The details (cached,
reasoning) are informative: when malformed they read as 0, and they never change the total.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

MAX_REPORTED = 100_000_000
"""The largest figure believed (100 million tokens: far past any model's context and output)."""


class UsageError(ValueError):
    """A usage object the gateway cannot trust; the message names the bad field."""


@dataclass(frozen=True, slots=True)
class TokenUsage:
    """What one call used, in tokens. ``input_tokens`` counts the prompt (for Anthropic, its
    uncached part; ``cache_creation_tokens`` and ``cache_read_tokens`` the rest), ``total``
    everything the call processed: what the gateway charges unless told otherwise."""

    input_tokens: int
    output_tokens: int
    total_tokens: int
    cached_tokens: int = 0
    reasoning_tokens: int = 0
    cache_creation_tokens: int = 0
    cache_read_tokens: int = 0


def count(value: object, field: str) -> int:
    """A reported figure, checked (module docstring); ``UsageError`` names ``field``."""
    if type(value) is not int or not 0 <= value <= MAX_REPORTED:
        raise UsageError(f"usage field {field!r} is {_show(value)}; expected a whole number "
                         f"from 0 to {MAX_REPORTED:_}")  # fmt: skip
    return value


def _detail(usage: Mapping[str, Any], outer: str, inner: str) -> int:
    """An informative detail (``prompt_tokens_details.cached_tokens``): 0 when not a count."""
    details = usage.get(outer)
    if not isinstance(details, dict):
        return 0
    value = details.get(inner)
    return value if type(value) is int and 0 <= value <= MAX_REPORTED else 0


def _mapping(usage: object) -> Mapping[str, Any]:
    if not isinstance(usage, dict):
        raise UsageError(f"usage is {_show(usage)}; expected an object")
    return usage


def openai_usage(usage: object) -> TokenUsage:
    """An OpenAI chat completion's, completion's or embedding's ``usage`` object."""
    u = _mapping(usage)
    prompt = count(u.get("prompt_tokens"), "prompt_tokens")
    completion = count(u.get("completion_tokens", 0), "completion_tokens")
    total = _total(u, prompt + completion)
    return TokenUsage(
        prompt,
        completion,
        total,
        cached_tokens=_detail(u, "prompt_tokens_details", "cached_tokens"),
        reasoning_tokens=_detail(u, "completion_tokens_details", "reasoning_tokens"),
    )


def responses_usage(usage: object) -> TokenUsage:
    """An OpenAI responses API ``usage`` object."""
    u = _mapping(usage)
    prompt = count(u.get("input_tokens"), "input_tokens")
    output = count(u.get("output_tokens"), "output_tokens")
    return TokenUsage(
        prompt,
        output,
        _total(u, prompt + output),
        cached_tokens=_detail(u, "input_tokens_details", "cached_tokens"),
        reasoning_tokens=_detail(u, "output_tokens_details", "reasoning_tokens"),
    )


def anthropic_usage(usage: object, base: TokenUsage | None = None) -> TokenUsage:
    """An Anthropic ``usage`` object; ``base`` (from ``message_start``) gives the fields a
    ``message_delta``'s usage leaves out (its counts are cumulative: the latest holds)."""
    u = _mapping(usage)

    def field(name: str, before: int | None) -> int:
        value = u.get(name)
        if value is None:
            if before is not None:
                return before
            if name == "input_tokens" or name == "output_tokens":
                raise UsageError(f"usage field {name!r} is missing; expected a whole number")
            return 0
        return count(value, name)

    prompt = field("input_tokens", base.input_tokens if base else None)
    output = field("output_tokens", base.output_tokens if base else None)
    created = field("cache_creation_input_tokens", base.cache_creation_tokens if base else None)
    read = field("cache_read_input_tokens", base.cache_read_tokens if base else None)
    return TokenUsage(
        prompt,
        output,
        prompt + output + created + read,
        cache_creation_tokens=created,
        cache_read_tokens=read,
    )


def _total(u: Mapping[str, Any], parts: int) -> int:
    if "total_tokens" not in u:
        return parts
    total = count(u["total_tokens"], "total_tokens")
    if total < parts:
        raise UsageError(f"usage total_tokens {total} is below its parts ({parts})")
    return total


def _show(value: object) -> str:
    text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."
