"""Fuzzing the three ways input gets in: ``Rate.parse``, the config loader and the HTTP API.

The promise checked: bad input is refused with our own error (``RateSpecError``,
``ConfigError`` naming file and line, a 4xx JSON ``{"error", "field"}``), never another
exception, a 500, a logged traceback or a hang. These run a few hundred examples each inside
``scripts/test``; ``scripts/fuzz`` runs the same properties far longer
(``RATEKEEPER_FUZZ_EXAMPLES``), plus atheris and schemathesis.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ratekeeper import Rate, RateSpecError
from ratekeeper.errors import ConfigError
from ratekeeper.rates import MAX_COUNT, MAX_PERIOD_MS
from ratekeeper.service.config.loader import parse_text
from ratekeeper.service.http.body import MAX_BODY
from ratekeeper.service.http.routes import ROUTES
from ratekeeper.service.server import ServeOptions, Service

EXAMPLES = int(os.environ.get("RATEKEEPER_FUZZ_EXAMPLES", "200"))
FUZZ = settings(
    max_examples=EXAMPLES,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)

# --- Rate.parse ---------------------------------------------------------------------------

UNITS = ["s", "sec", "second", "seconds", "m", "min", "minute", "h", "hr", "hour", "d", "day"]
NUMBER = st.one_of(
    st.integers(0, 10**14).map(str),
    st.text("0123456789", min_size=1, max_size=40),
    st.sampled_from(["-1", "1.5", "1e3", "٣", "½", "0x10", " 1", "1_000", "∞", ""]),
)
RATE_PART = st.builds(
    lambda n, sep, m, u: f"{n}{sep}{m}{u}",
    NUMBER,
    st.sampled_from(["/", " per ", "/ ", " / ", "//", "per", "\t/\n"]),
    st.one_of(st.just(""), NUMBER),
    st.one_of(st.sampled_from(UNITS), st.text(max_size=6), st.sampled_from(["MS", "Min", "ß"])),
)
RATE_TEXT = st.one_of(
    st.text(max_size=80),
    st.lists(RATE_PART, min_size=1, max_size=4).map("; ".join),
    st.lists(RATE_PART, min_size=1, max_size=4).map(",".join),
    RATE_PART,
)


@FUZZ
@given(RATE_TEXT)
def test_rate_parse_returns_rates_or_names_the_problem(text: str) -> None:
    try:
        rates = Rate.parse(text)
    except RateSpecError as exc:
        message = str(exc)
        assert message.startswith("rate"), message
        assert "expected" in message or "must" in message or "once" in message, message
        return
    assert rates and all(isinstance(r, Rate) for r in rates)
    for r in rates:
        assert 1 <= r.count <= MAX_COUNT and 1 <= r.period_ms <= MAX_PERIOD_MS
        assert Rate.parse(str(r)) == (r,)  # what we print, we read back as the same rate


@pytest.mark.parametrize(
    "text",
    ["1" * 5000 + "/s", "1/" + "9" * 400 + "s", "1/" + "9" * 5000 + "s", "9" * 14 + "/h"],
)
def test_rate_parse_with_thousands_of_digits(text: str) -> None:
    """Found by fuzzing: these raised ValueError (int() digit limit) or OverflowError."""
    with pytest.raises(RateSpecError, match=r"out of range|too long"):
        Rate.parse(text)


# --- the config loader --------------------------------------------------------------------

KEYS = st.sampled_from(
    [
        "store", "auth", "limits", "policies", "domains", "domain", "descriptors", "rate",
        "algorithm", "burst", "buckets", "shadow", "enabled", "url", "max_keys", "prefix",
        "socket_timeout", "batch", "shards", "cluster", "token", "admin_token", "token_env",
        "grpc", "max_key_length", "local_cache", "key", "value", "rate_limit", "unit",
        "requests_per_unit", "unlimited", "policy", "shadow_mode", "replicas", "name", "p",
    ]
)  # fmt: skip
SCALARS = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-(2**70), 2**70),
    st.floats(allow_nan=True, allow_infinity=True),
    st.text(max_size=20),
    st.sampled_from(
        ["100/minute", "1/s; 10/h", "fixed_window", "token_bucket", "gcra", "sliding_window",
         "sliding_log", "redis://127.0.0.1:1", "memory", "hour", "second", "x" * 20]
    ),
)  # fmt: skip
DOCS = st.recursive(
    SCALARS,
    lambda inner: st.one_of(
        st.lists(inner, max_size=4), st.dictionaries(KEYS | st.text(max_size=8), inner, max_size=5)
    ),
    max_leaves=30,
)
LINE_PREFIX = re.compile(r"^<config>:\d+: \S")


def _check_config(text: str) -> None:
    try:
        config = parse_text(text)
    except ConfigError as exc:
        assert LINE_PREFIX.match(str(exc)), str(exc)
        return
    assert config.policies is not None


@FUZZ
@given(st.dictionaries(KEYS, DOCS, max_size=5))
def test_config_loader_on_structured_documents(doc: dict[str, Any]) -> None:
    _check_config(yaml.safe_dump(doc, allow_unicode=True))


@FUZZ
@given(st.text(max_size=300))
def test_config_loader_on_arbitrary_text(text: str) -> None:
    _check_config(text)


BASE_CONFIG = """\
policies:
  p:
    rate: 5/minute
    algorithm: token_bucket
domains:
  - domain: d
    descriptors:
      - key: k
        rate_limit: {unit: hour, requests_per_unit: 2}
"""


@FUZZ
@given(st.integers(0, len(BASE_CONFIG) - 1), st.text(max_size=12), st.integers(0, 8))
def test_config_loader_on_mutated_valid_config(at: int, insert: str, cut: int) -> None:
    _check_config(BASE_CONFIG[:at] + insert + BASE_CONFIG[at + cut :])


@pytest.mark.parametrize(
    "text",
    [
        "policies: " + "[" * 3000 + "]" * 3000,
        "policies: " + "{a: " * 3000 + "1" + "}" * 3000,
        "limits:\n  max_key_length: " + "9" * 5000,
        "policies:\n  p:\n    rate: 1/" + "9" * 400 + "s",
    ],
    ids=["deep-list", "deep-map", "huge-int", "huge-period"],
)
def test_config_loader_regressions(text: str) -> None:
    """Found by fuzzing: RecursionError, ValueError and OverflowError escaped the loader."""
    with pytest.raises(ConfigError, match=r"^<config>:\d+: "):
        parse_text(text)


@pytest.mark.parametrize("text", ["domain: d\n", "domains:\n  - domain: d\n"])
def test_a_domain_without_descriptors_limits_nothing(text: str) -> None:
    """Found by atheris: a domain without ``descriptors`` raised AttributeError."""
    domains = parse_text(text).domains
    assert list(domains) == ["d"] and not domains["d"].children


# --- the HTTP API, in process (the real ASGI app of a real Service, memory store) -------------

CONFIG = """\
auth:
  token: client-token-fuzz-0123456789
  admin_token: admin-token-fuzz-0123456789
limits:
  max_key_length: 64
policies:
  p:
    rate: 3/minute
  stacked:
    rate: 2/second; 10/hour
    algorithm: sliding_window
"""
TOKENS = ["client-token-fuzz-0123456789", "admin-token-fuzz-0123456789"]


@pytest.fixture(scope="module")
def service(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Service]:
    path = tmp_path_factory.mktemp("fuzz") / "ratekeeper.yaml"
    path.write_text(CONFIG)
    yield Service(ServeOptions(config_files=(str(path),), grpc_port=None))


@pytest.fixture(scope="module")
def loop() -> Iterator[asyncio.AbstractEventLoop]:
    loop = asyncio.new_event_loop()
    yield loop
    loop.close()


async def call(
    app: Any, method: str, path: str, headers: list[tuple[bytes, bytes]], chunks: list[bytes]
) -> tuple[int, dict[str, str], bytes]:
    """One request through the ASGI app; the body arrives in ``chunks``."""
    pending = [
        {"type": "http.request", "body": c, "more_body": i < len(chunks) - 1}
        for i, c in enumerate(chunks or [b""])
    ]
    sent: list[dict[str, Any]] = []

    async def receive() -> dict[str, Any]:
        return pending.pop(0) if pending else {"type": "http.disconnect"}

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    scope = {"type": "http", "method": method, "path": path, "headers": headers}
    await asyncio.wait_for(app(scope, receive, send), timeout=10)  # a hang fails the test
    start, body = sent[0], sent[1]
    return (
        start["status"],
        {k.decode("latin-1"): v.decode("latin-1") for k, v in start["headers"]},
        body["body"],
    )


def check_answer(status: int, headers: dict[str, str], body: bytes) -> Any:
    """The API's promise for any request: no 500, JSON that says what was wrong."""
    assert status < 500 or status == 503, (status, body)
    assert int(headers["content-length"]) == len(body)
    if headers["content-type"].startswith(("text/plain", "text/html")):  # /metrics, /dashboard
        return body.decode()
    data = json.loads(body)
    if status >= 400:
        assert isinstance(data["error"], str) and len(data["error"]) > 5, data
        assert isinstance(data["field"], str) and data["field"], data
    return data


JSON_VALUES = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(), inner, max_size=3),
    max_leaves=10,
)
FIELD_VALUES = st.one_of(
    JSON_VALUES,
    st.sampled_from(["p", "stacked", "nope", "", "k", "x" * 65, "\ud800", "😀", "a\x00b"]),
    st.integers(-(2**64), 2**64),
    st.sampled_from([0, 1, 2, 2**31 - 1, 2**31, True, 1.0, 1.5, "1"]),
)
REQUEST_OBJECTS = st.dictionaries(
    st.sampled_from(["policy", "key", "cost", "enabled", "shadow", "extra", ""]),
    FIELD_VALUES,
    max_size=4,
)


def _encode(value: Any) -> bytes:
    return json.dumps(value, ensure_ascii=False).encode("utf-8", "surrogatepass")


BODIES = st.one_of(
    REQUEST_OBJECTS.map(_encode),
    JSON_VALUES.map(_encode),
    st.binary(max_size=200),
    st.sampled_from(
        [b"", b"{", b'{"policy": NaN}', b'{"policy": Infinity}', b"[" * 100_000,
         b'{"a":1,"a":2}', b"\xff\xfe", b'{"key": "\\ud800"}', b"0" * 5000, b" " * 10]
    ),
)  # fmt: skip
PATHS = st.one_of(
    st.sampled_from([r.path.replace("{name}", "p") for r in ROUTES]),
    st.sampled_from(["/v1/admin/policies/nope", "/v1/admin/policies/", "/", "/v1", "/v1/hit/"]),
    st.text(max_size=30).map(lambda t: "/" + t),
)
AUTH = st.one_of(
    st.none(),
    st.sampled_from(TOKENS).map(lambda t: b"Bearer " + t.encode()),
    st.binary(max_size=40).map(lambda b: b"Bearer " + b),
)


@FUZZ
@given(
    method=st.sampled_from(["GET", "POST", "PUT", "DELETE", "HEAD", "PATCH", "OPTIONS"]),
    path=PATHS,
    auth=AUTH,
    body=BODIES,
    split=st.integers(1, 4),
    length=st.sampled_from([None, "correct", "-1", "abc", "99999999999999999999", "1e3"]),
)
def test_http_api_answers_every_request_with_a_clear_status(
    service: Service,
    loop: asyncio.AbstractEventLoop,
    caplog: pytest.LogCaptureFixture,
    method: str,
    path: str,
    auth: bytes | None,
    body: bytes,
    split: int,
    length: str | None,
) -> None:
    headers = [(b"content-type", b"application/json")]
    if auth is not None:
        headers.append((b"authorization", auth))
    if length is not None:
        value = str(len(body)) if length == "correct" else length
        headers.append((b"content-length", value.encode()))
    step = max(1, len(body) // split)
    chunks = [body[i : i + step] for i in range(0, len(body), step)]
    with caplog.at_level(logging.ERROR, logger="ratekeeper"):
        status, out_headers, out = loop.run_until_complete(
            call(service.api, method, path, headers, chunks)
        )
    check_answer(status, out_headers, out)
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR and r.exc_info]


@FUZZ
@given(op=st.sampled_from(["hit", "peek", "refund", "reset"]), req=REQUEST_OBJECTS)
def test_decision_routes_validate_every_field(
    service: Service, loop: asyncio.AbstractEventLoop, op: str, req: dict[str, Any]
) -> None:
    """Authorized, well-formed JSON objects: either a decision or a 4xx naming the field."""
    headers = [(b"authorization", f"Bearer {TOKENS[1]}".encode())]
    status, out_headers, body = loop.run_until_complete(
        call(service.api, "POST", f"/v1/{op}", headers, [_encode(req)])
    )
    data = check_answer(status, out_headers, body)
    if status == 200:
        assert data["policy"] in ("p", "stacked")
        return
    assert status in (400, 404), (status, data)
    allowed = {"body", "policy", "key", "cost"} | set(req)
    assert data["field"] in allowed, data


def test_an_oversized_body_is_refused_without_reading_it_all(
    service: Service, loop: asyncio.AbstractEventLoop
) -> None:
    headers = [(b"authorization", f"Bearer {TOKENS[0]}".encode())]
    chunks = [b"x" * 4096] * (MAX_BODY // 4096 + 2)
    status, out_headers, body = loop.run_until_complete(
        call(service.api, "POST", "/v1/hit", headers, chunks)
    )
    assert status == 413 and check_answer(status, out_headers, body)["field"] == "body"


def test_regression_inputs_found_while_fuzzing(
    service: Service, loop: asyncio.AbstractEventLoop, tmp_path: Path
) -> None:
    """Lone surrogates, NUL and huge numbers in fields are 4xx or counted, never 500."""
    headers = [(b"authorization", f"Bearer {TOKENS[0]}".encode())]
    for raw in [
        b'{"policy":"p","key":"\\ud800"}',
        b'{"policy":"p","key":"a\\u0000b"}',
        b'{"policy":"p","key":"k","cost":' + b"9" * 5000 + b"}",
        b'{"policy":"p","key":"k","cost":1e400}',
        b'{"policy":"\\udfff","key":"k"}',
        b'{"policy":"p","key":"float-cost","cost":2.0}',
    ]:
        status, out_headers, body = loop.run_until_complete(
            call(service.api, "POST", "/v1/hit", headers, [raw])
        )
        data = check_answer(status, out_headers, body)
        if b"float-cost" in raw:  # found by schemathesis: JSON Schema's integer admits 2.0
            assert status == 200 and data["remaining"] == 1, data


REASONS = {
    "body", "policy", "key", "cost", "path", "method", "authorization", "enabled", "shadow",
    "block", "name", "mode", "lease", "query", "count", "limit", "tenant", "rate", "units",
    "until", "by", "plan", "levels", "estimate", "ttl", "reservation", "actual",
    "over_limit_status",
}  # fmt: skip
"""The fields a refusal may name (a fixed set: the fuzzed routes reach any of them)."""
LEVEL_REASON = re.compile(r"levels\[\d{1,2}\](\.(policy|key|cost))?")
"""A nested call's level and field (at most 16 levels)."""


def test_refusals_never_add_metric_labels_of_the_clients_choosing(
    service: Service, loop: asyncio.AbstractEventLoop
) -> None:
    """Found by fuzzing: an unknown JSON field's name became the ``reason`` label, so a client
    sending fresh names grew the metrics (one time series each) without bound."""
    headers = [(b"authorization", f"Bearer {TOKENS[0]}".encode())]
    for i in range(50):
        raw = _encode({"policy": "p", "key": "k", f"field-{i}": 1})
        status, out_headers, body = loop.run_until_complete(
            call(service.api, "POST", "/v1/hit", headers, [raw])
        )
        data = check_answer(status, out_headers, body)
        assert status == 400 and data["field"] == "body" and f"field-{i}" in data["error"]
        level = {"policy": "p", "key": "k", f"level-field-{i}": 1}  # a nested call's level
        raw = _encode({"levels": [level]})
        status, out_headers, body = loop.run_until_complete(
            call(service.api, "POST", "/v1/hit", headers, [raw])
        )
        data = check_answer(status, out_headers, body)
        assert status == 400 and data["field"] == "levels[0]", data
        assert f"level-field-{i}" in data["error"]
    status, _, text = loop.run_until_complete(call(service.api, "GET", "/metrics", [], []))
    reasons = set(re.findall(r'ratekeeper_requests_refused_total\{reason="([^"]*)"', text.decode()))
    assert "body" in reasons, reasons
    assert all(r in REASONS or LEVEL_REASON.fullmatch(r) for r in reasons), reasons
