"""Provider-style headers and bodies, in the formats the SDKs and pacing clients read."""

from __future__ import annotations

import json

from ratekeeper.llm import go_duration
from ratekeeper.llm.headers import (
    Figures,
    anthropic_error,
    anthropic_headers,
    openai_error,
    openai_headers,
    retry_headers,
    rfc3339,
)


def test_go_durations() -> None:
    cases = {
        0: "0s",
        0.0001: "1ms",
        0.02: "20ms",
        0.9994: "1s",
        1: "1s",
        1.5: "1.5s",
        17.28: "17.28s",
        60: "1m0s",
        360: "6m0s",
        361.25: "6m1.25s",
        3600: "1h0m0s",
        3723.5: "1h2m3.5s",
        -3: "0s",
    }
    for seconds, text in cases.items():
        assert go_duration(seconds) == text, seconds


def test_rfc3339_rounds_up() -> None:
    assert rfc3339(1_700_000_000.0) == "2023-11-14T22:13:20Z"
    assert rfc3339(1_700_000_000.2) == "2023-11-14T22:13:21Z"


def test_families() -> None:
    req, tok = Figures(60, 59, 1.0, 1_700_000_001.0), Figures(1000, 900, 360.0, 1_700_000_360.0)
    assert openai_headers(req, tok) == [
        ("x-ratelimit-limit-requests", "60"),
        ("x-ratelimit-remaining-requests", "59"),
        ("x-ratelimit-reset-requests", "1s"),
        ("x-ratelimit-limit-tokens", "1000"),
        ("x-ratelimit-remaining-tokens", "900"),
        ("x-ratelimit-reset-tokens", "6m0s"),
    ]
    names = [k for k, _ in anthropic_headers(req, tok)]
    for kind in ("requests", "tokens", "input-tokens", "output-tokens"):
        for part in ("limit", "remaining", "reset"):
            assert f"anthropic-ratelimit-{kind}-{part}" in names
    assert openai_headers(None, tok)[0][0] == "x-ratelimit-limit-tokens"


def test_retry_headers() -> None:
    assert retry_headers(5.2) == [
        ("retry-after", "6"),
        ("retry-after-ms", "5200"),
        ("x-should-retry", "true"),
    ]
    assert retry_headers(0.01)[0] == ("retry-after", "1")
    assert dict(retry_headers(86_400.0))["x-should-retry"] == "false"  # a budget: do not sleep
    assert retry_headers(float("inf")) == [("x-should-retry", "false")]


def test_error_bodies() -> None:
    body = json.loads(openai_error("slow down", "tokens", "rate_limit_exceeded"))
    assert body == {
        "error": {
            "message": "slow down",
            "type": "tokens",
            "param": None,
            "code": "rate_limit_exceeded",
        }
    }
    body = json.loads(anthropic_error(429, "slow down"))
    assert body == {"type": "error", "error": {"type": "rate_limit_error", "message": "slow down"}}
