"""Meters read the provider's usage from real-format bodies and streams, cut anywhere, and
never raise on what an upstream sends."""

from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ratekeeper.llm import (
    BodyMeter,
    StreamMeter,
    TokenUsage,
    UsageError,
    anthropic_usage,
    heuristic_tokens,
    openai_usage,
    responses_usage,
)
from tests.llm.fake_upstream import _events, _whole

COUNT = st.integers(min_value=0, max_value=50)


def _cut(data: bytes, points: list[int]) -> list[bytes]:
    points = sorted({p % (len(data) + 1) for p in points})
    out, last = [], 0
    for p in points:
        out.append(data[last:p])
        last = p
    return [*out, data[last:]]


def _stream(api: str, prompt: int, output: int, mode: str = "") -> bytes:
    body = {"stream_options": {"include_usage": True}}
    return b"".join(_events(api, prompt, output, mode, body))


@settings(max_examples=200, deadline=None)
@given(
    st.sampled_from(["chat", "completions", "responses", "messages"]),
    st.integers(min_value=1, max_value=10_000),
    COUNT,
    st.lists(st.integers(min_value=0, max_value=100_000), max_size=30),
    st.sampled_from(["", "crlf", "cr"]),
    st.booleans(),
)
def test_streams_cut_anywhere(api, prompt, output, points, mode, text) -> None:  # type: ignore[no-untyped-def]
    data = _stream(api, prompt, output)
    if mode == "crlf":
        data = data.replace(b"\n", b"\r\n")
    elif mode == "cr":
        data = data.replace(b"\n", b"\r")
    meter = StreamMeter(api, heuristic_tokens, text=text)
    for chunk in _cut(data, points):
        meter.feed(chunk)
    meter.close()
    assert meter.problems == {}
    assert meter.usage is not None
    assert (meter.usage.input_tokens, meter.usage.output_tokens) == (prompt, output)
    assert meter.usage.total_tokens == prompt + output
    assert meter.output >= output  # each text delta counted, at least 1
    if api == "messages":
        assert meter.input == prompt  # known from message_start, before the end


@pytest.mark.parametrize("api", ["chat", "completions", "responses", "embeddings", "messages"])
def test_bodies(api: str) -> None:
    body = json.dumps(_whole(api, 12, 0 if api == "embeddings" else 7, "")).encode()
    meter = BodyMeter(api, heuristic_tokens)
    for i in range(0, len(body), 5):
        meter.feed(body[i : i + 5])
    meter.close()
    assert meter.problems == {}
    assert meter.usage is not None
    assert meter.usage.input_tokens == 12


@pytest.mark.parametrize(
    ("mode", "problem"),
    [
        ("malformed", "malformed_event"),
        ("no_usage", "usage_missing"),
        ("negative", "usage_invalid"),
        ("huge", "usage_invalid"),
        ("float", "usage_invalid"),
        ("string_usage", "usage_invalid"),
        ("twice", "usage_repeated"),
    ],
)
@pytest.mark.parametrize("text", [True, False])
def test_hostile_streams_are_noted(mode: str, problem: str, text: bool) -> None:
    meter = StreamMeter("chat", heuristic_tokens, text=text)
    data = _stream("chat", 10, 5, mode)
    for i in range(0, len(data), 7):
        meter.feed(data[i : i + 7])
    meter.close()
    assert problem in meter.problems
    if mode != "malformed":
        assert meter.usage is None  # no usage to trust: the gateway keeps its estimate
    if mode == "twice":
        assert meter.best is not None and meter.best.total_tokens == 15


def test_anthropic_message_start_twice_and_cumulative_deltas() -> None:
    usage = b'{"usage":{"input_tokens":9,"output_tokens":1}}'
    start = b'event: message_start\ndata: {"type":"message_start","message":' + usage + b"}\n\n"
    delta = b'event: message_delta\ndata: {"type":"message_delta","usage":{"output_tokens":%d}}\n\n'
    meter = StreamMeter("messages", heuristic_tokens)
    meter.feed(start + delta % 3 + delta % 8)
    meter.close()
    assert meter.problems == {} and meter.usage == TokenUsage(9, 8, 17)  # cumulative: the latest
    meter = StreamMeter("messages", heuristic_tokens)
    meter.feed(start + start + delta % 8)
    meter.close()
    assert "usage_repeated" in meter.problems and meter.usage is None


def test_a_body_past_its_bound_is_not_read() -> None:
    meter = BodyMeter("chat", heuristic_tokens, max_bytes=100)
    for _ in range(1000):
        meter.feed(b" " * 1000)
    meter.feed(b'{"usage": {"prompt_tokens": 1, "completion_tokens": 1}}')
    meter.close()
    assert "body_too_large" in meter.problems and meter.usage is None


@settings(max_examples=300, deadline=None)
@given(
    st.sampled_from(["chat", "completions", "responses", "messages", "embeddings"]),
    st.binary(max_size=2000),
    st.lists(st.integers(min_value=0, max_value=3000), max_size=10),
)
def test_garbage_never_raises(api, data, points) -> None:  # type: ignore[no-untyped-def]
    meters = (
        StreamMeter(api, heuristic_tokens, 256),
        BodyMeter(api, heuristic_tokens, 256),
        StreamMeter(api, heuristic_tokens, 256, text=False),
    )
    for meter in meters:
        for chunk in _cut(data, points):
            meter.feed(chunk)
        meter.close()


JSONISH = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=5),
    lambda inner: (
        st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=8), inner, max_size=3)
    ),
    max_leaves=10,
)


@settings(max_examples=300, deadline=None)
@given(
    st.sampled_from(["chat", "responses", "messages"]),
    st.lists(
        st.tuples(
            st.sampled_from(
                [
                    "message",
                    "message_start",
                    "message_delta",
                    "response.completed",
                    "content_block_delta",
                ]
            ),
            st.dictionaries(
                st.sampled_from(
                    ["type", "usage", "choices", "delta", "message", "response", "error"]
                ),
                JSONISH,
                max_size=4,
            ),
        ),
        max_size=6,
    ),
)
def test_odd_json_events_never_raise(api, events) -> None:  # type: ignore[no-untyped-def]
    full, fast = StreamMeter(api, heuristic_tokens), StreamMeter(api, heuristic_tokens, text=False)
    for meter in (full, fast):
        for kind, obj in events:
            meter.feed(f"event: {kind}\ndata: ".encode() + json.dumps(obj).encode() + b"\n\n")
        meter.close()
        if meter.usage is not None:
            assert meter.usage.total_tokens >= 0
    # counting without parsing never reads another usage than parsing does
    assert (fast.usage, fast.best) == (full.usage, full.best)
    assert set(fast.problems) == set(full.problems)


def test_an_over_long_event_is_dropped_in_either_mode() -> None:
    for text in (True, False):
        meter = StreamMeter("chat", heuristic_tokens, 1000, text=text)
        data = b'data: {"x": "' + b"y" * 5000 + b'"}\n\n' + _stream("chat", 3, 2)
        for i in range(0, len(data), 100):
            meter.feed(data[i : i + 100])
            assert len(meter._pending) <= 1100
        meter.close()
        assert meter.usage is not None and meter.usage.total_tokens == 5
        assert "event_too_large" in meter.problems


def test_usage_readers() -> None:
    u = openai_usage(
        {
            "prompt_tokens": 10,
            "completion_tokens": 5,
            "total_tokens": 15,
            "prompt_tokens_details": {"cached_tokens": 4},
            "completion_tokens_details": {"reasoning_tokens": 3},
        }
    )
    assert u == TokenUsage(10, 5, 15, cached_tokens=4, reasoning_tokens=3)
    assert openai_usage({"prompt_tokens": 8, "total_tokens": 8}) == TokenUsage(8, 0, 8)
    r = responses_usage(
        {
            "input_tokens": 3,
            "output_tokens": 4,
            "total_tokens": 7,
            "input_tokens_details": {"cached_tokens": 1},
            "output_tokens_details": {"reasoning_tokens": 2},
        }
    )
    assert r == TokenUsage(3, 4, 7, cached_tokens=1, reasoning_tokens=2)
    a = anthropic_usage(
        {
            "input_tokens": 3,
            "output_tokens": 4,
            "cache_creation_input_tokens": 10,
            "cache_read_input_tokens": 20,
        }
    )
    assert a == TokenUsage(3, 4, 37, cache_creation_tokens=10, cache_read_tokens=20)
    for bad in (
        {"prompt_tokens": -1},
        {"prompt_tokens": 1.0},
        {"prompt_tokens": True},
        {"prompt_tokens": 10**12},
        {"prompt_tokens": 5, "completion_tokens": 5, "total_tokens": 3},
        [],
        None,
    ):
        with pytest.raises(UsageError):
            openai_usage(bad)
    # a detail that is no count reads as 0, and never changes the total
    assert openai_usage({"prompt_tokens": 1, "prompt_tokens_details": {"cached_tokens": -4}}) == (
        TokenUsage(1, 0, 1)
    )
