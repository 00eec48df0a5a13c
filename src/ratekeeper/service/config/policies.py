"""The service's policy types: a named, validated rate stack (``PolicySpec``) or concurrency
cap (``ConcurrencySpec``), and ``policy_from``, which builds a ``PolicySpec`` from config
values and reports a bad rate or algorithm at the line that holds it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ...algorithms import ALGORITHMS
from ...errors import ConfigError, RateSpecError
from ...plan import Policy, make_policy
from ...rates import Rate, to_rates
from ...yaml_lines import Map, Problem


@dataclass(frozen=True, slots=True)
class PolicySpec:
    """A named policy: a validated rate stack, and whether it is enforced."""

    name: str
    policy: Policy
    rate_text: str
    algorithm: str
    burst: int | None = None
    buckets: int | None = None
    shadow: bool = False
    enabled: bool = True
    block: bool = False
    """Envoy's ``requests_per_unit: 0``: every request is over the limit."""
    aligned: bool = False
    count_rejected: bool = False
    """fixed_window's options (envoyproxy/ratelimit's counting, for Envoy domains)."""
    label: str = ""
    """The ``policy`` label of its metrics when not ``name`` (an Envoy limit override's name
    holds the caller's rate, which must not become a label value)."""
    plan: str = ""
    """The plans' limit this policy counts (``rate: plan:<limit>``; ``config.quotas``), else
    empty: its ``policy`` is then the default plan's, for descriptions only."""


@dataclass(frozen=True, slots=True)
class ConcurrencySpec:
    """A named concurrency policy: at most ``capacity`` leases live per key."""

    name: str
    capacity: int
    lease_ttl: float = 60.0
    """Seconds after which a lease never released (a crashed caller) expires."""
    shadow: bool = False
    enabled: bool = True


def policy_from(
    name: str,
    rate: str | Rate,
    algorithm: Any,
    options: dict[str, int],
    where: Map,
    upstream: bool = False,
) -> PolicySpec:
    """A ``PolicySpec`` (``upstream``: an aligned fixed window counting rejected hits too), or
    a ``Problem`` at the line of the rate, the rate_limit or the algorithm."""
    line = where.lines.get("rate", where.lines.get("rate_limit", where.line))
    found = []  # the algorithm and the rate are read apart: a bad one hides no other
    if not isinstance(algorithm, str):
        found.append(
            Problem(where.lines.get("algorithm", line), f"algorithm {algorithm!r} must be a string")
        )
    elif algorithm not in ALGORITHMS:
        known = ", ".join(sorted(ALGORITHMS))
        found.append(
            Problem(
                where.lines.get("algorithm", line),
                f"algorithm {algorithm!r} is unknown; expected one of {known}",
            )
        )
    else:
        takes = ALGORITHMS[algorithm].OPTIONS
        for option in sorted(set(options) - set(takes)):
            found.append(
                Problem(
                    where.lines.get(option, line),
                    f"option {option!r} does not apply to {algorithm}; it takes "
                    f"{', '.join(sorted(takes)) or 'no options'}",
                )
            )
    try:
        to_rates(rate)
    except (ConfigError, RateSpecError) as exc:
        found.append(Problem(line, str(exc)))
    if found:
        raise Problem.first_of(sorted(found, key=lambda p: p.line))
    try:
        policy = make_policy(
            rate, algorithm, options.get("burst"), options.get("buckets"), upstream, upstream
        )
    except (ConfigError, RateSpecError) as exc:
        bad = "algorithm" if "algorithm" in str(exc) and "algorithm" in where else "rate"
        raise Problem(where.lines.get(bad, line), str(exc)) from None
    text = rate if isinstance(rate, str) else str(rate)
    return PolicySpec(
        name, policy, text, algorithm, options.get("burst"), options.get("buckets"),
        aligned=upstream, count_rejected=upstream,
    )  # fmt: skip
