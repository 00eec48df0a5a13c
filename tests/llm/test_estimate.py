"""Estimator: the reservation is the worst case the body sent upstream allows."""

from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ratekeeper.llm import BadRequest, Estimator, heuristic_tokens

EST = Estimator(max_output=1000, model_max_output={"small": 100}, default_output=300)


def _sent(api: str, body: object, est: Estimator = EST) -> tuple[dict, int, int]:  # type: ignore[type-arg]
    p = est.prepare(api, json.dumps(body).encode())
    return json.loads(p.body), p.input_tokens, p.output_tokens


def test_heuristic() -> None:
    assert heuristic_tokens("") == 0
    assert heuristic_tokens("abc") == 1
    assert heuristic_tokens("abcd") == 2
    assert heuristic_tokens("é") == 1  # 2 bytes
    assert heuristic_tokens("日本") == 2  # 6 bytes


def test_the_most_is_capped_and_written_in() -> None:
    msgs = [{"role": "user", "content": "hi"}]
    sent, _, out = _sent("chat", {"model": "m", "messages": msgs, "max_tokens": 5000})
    assert (sent["max_tokens"], out) == (1000, 1000)
    sent, _, out = _sent("chat", {"model": "small", "messages": msgs, "max_tokens": 5000})
    assert (sent["max_tokens"], out) == (100, 100)
    sent, _, out = _sent("chat", {"model": "m", "messages": msgs})
    assert (sent["max_completion_tokens"], out) == (300, 300)  # none named: the default, written
    sent, _, out = _sent("chat", {"messages": msgs, "max_tokens": 10, "max_completion_tokens": 50})
    assert out == 50  # both named: the larger
    sent, _, out = _sent("responses", {"input": "hi"})
    assert (sent["max_output_tokens"], out) == (300, 300)
    sent, _, out = _sent("messages", {"messages": msgs, "max_tokens": 20})
    assert (sent["max_tokens"], out) == (20, 20)
    sent, _, out = _sent("completions", {"prompt": "hi", "n": 3, "best_of": 4, "max_tokens": 10})
    assert out == 40
    sent, inp, out = _sent("embeddings", {"input": [[1, 2, 3], [4, 5]]})
    assert out == 0 and inp >= 5


def test_chat_max_field() -> None:
    est = Estimator(chat_max_field="max_tokens", default_output=7)
    sent, _, _out = _sent("chat", {"messages": []}, est)
    assert sent["max_tokens"] == 7 and "max_completion_tokens" not in sent


def test_a_key_given_twice_reaches_the_upstream_once() -> None:
    raw = b'{"messages": [], "max_tokens": 1, "max_tokens": 900}'
    p = EST.prepare("chat", raw)
    assert json.loads(p.body)["max_tokens"] == 900 and p.output_tokens == 900
    assert p.body.count(b"max_tokens") == 1


def test_include_usage_is_forced_when_streaming() -> None:
    sent, _, _ = _sent(
        "chat", {"messages": [], "stream": True, "stream_options": {"include_usage": False}}
    )
    assert sent["stream_options"] == {"include_usage": True}
    sent, _, _ = _sent("completions", {"prompt": "x", "stream": True, "stream_options": "no"})
    assert sent["stream_options"] == {"include_usage": True}
    sent, _, _ = _sent("messages", {"messages": [], "stream": True})
    assert "stream_options" not in sent  # Anthropic's stream always carries its usage


def test_images_count_a_part_not_their_bytes() -> None:
    image = "data:image/png;base64," + "A" * 100_000
    content = [
        {"type": "text", "text": "what is this"},
        {"type": "image_url", "image_url": {"url": image}},
    ]
    _, inp, _ = _sent("chat", {"messages": [{"role": "user", "content": content}]})
    assert 1024 < inp < 1100
    _, inp, _ = _sent("chat", {"messages": [{"role": "user", "content": image}]})
    assert 1024 <= inp < 1100


@pytest.mark.parametrize(
    "body",
    [
        b"not json",
        b"[1, 2]",
        b'{"messages": [], "max_tokens": 0}',
        b'{"messages": [], "max_tokens": -3}',
        b'{"messages": [], "max_tokens": 1.5}',
        b'{"messages": [], "max_tokens": "10"}',
        b'{"messages": [], "max_tokens": true}',
        b'{"messages": [], "n": 0}',
        b'{"messages": [], "n": 1000}',
        b'{"messages": [], "stream": "yes"}',
        b'{"messages": [], "temperature": NaN}',
        b'{"messages": [], "temperature": 1e400}',
        b'{"messages": ["\\ud800"]}',
        b"[" * 100_000 + b"]" * 100_000,
    ],
)
def test_bad_bodies_are_400s(body: bytes) -> None:
    with pytest.raises(BadRequest):
        EST.prepare("chat", body)


def test_bad_settings_are_refused() -> None:
    for kwargs in (
        {"max_output": 0},
        {"default_output": -1},
        {"chat_max_field": "x"},
        {"model_max_output": {"m": 0}},
        {"count": 3},
    ):
        with pytest.raises(ValueError):
            Estimator(**kwargs)  # type: ignore[arg-type]


JSON = st.recursive(
    st.none() | st.booleans() | st.integers(-5, 10**6) | st.text(max_size=20),
    lambda inner: (
        st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=10), inner, max_size=4)
    ),
    max_leaves=20,
)
FIELDS = st.dictionaries(
    st.sampled_from(
        [
            "model",
            "messages",
            "max_tokens",
            "max_completion_tokens",
            "max_output_tokens",
            "n",
            "best_of",
            "stream",
            "stream_options",
            "input",
            "prompt",
            "system",
            "tools",
        ]
    ),
    JSON,
    max_size=8,
)


@settings(max_examples=400, deadline=None)
@given(st.sampled_from(["chat", "completions", "responses", "embeddings", "messages"]), FIELDS)
def test_any_body_is_prepared_or_refused_and_bounded(api, body) -> None:  # type: ignore[no-untyped-def]
    try:
        p = EST.prepare(api, json.dumps(body).encode())
    except BadRequest:
        return
    sent = json.loads(p.body)
    assert p.estimate >= 1
    fields = {
        "chat": ("max_tokens", "max_completion_tokens"),
        "completions": ("max_tokens",),
        "responses": ("max_output_tokens",),
        "messages": ("max_tokens",),
    }
    written = [sent[f] for f in fields.get(api, ()) if sent.get(f) is not None]
    assert all(1 <= most <= 1000 for most in written)
    if api in fields:
        assert written, "the most is always written into what the upstream gets"
        per_choice = max(written)
        assert p.output_tokens >= per_choice
    if api in ("chat", "completions", "responses", "messages"):
        assert p.output_tokens >= 1  # never unlimited, never nothing
    if sent.get("stream") is True and api in ("chat", "completions"):
        assert sent["stream_options"]["include_usage"] is True
