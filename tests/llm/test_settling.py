"""What a response is charged once it has ended: settling.charge_of's table."""

from __future__ import annotations

from ratekeeper.llm import StreamMeter, TokenUsage, charge_of, heuristic_tokens
from ratekeeper.llm.estimate import Prepared
from tests.llm.fake_upstream import _events

PREP = Prepared(b"{}", True, "m", 40, 100)  # an estimate of 140


def _meter(mode: str = "", output: int = 10, upto: int | None = None) -> StreamMeter:
    data = b"".join(_events("chat", 30, output, mode, {"stream_options": {"include_usage": True}}))
    meter = StreamMeter("chat", heuristic_tokens)
    meter.feed(data[:upto] if upto is not None else data)
    return meter


def test_clean_usage_is_charged() -> None:
    m = _meter()
    m.close()
    assert charge_of(m, PREP, "complete", 200) == 40
    assert charge_of(m, PREP, "complete", 200, lambda u: u.output_tokens) == 10


def test_no_trustworthy_usage_keeps_the_estimate() -> None:
    for mode in ("no_usage", "negative", "huge", "float", "twice", "malformed"):
        m = _meter(mode)
        m.close()
        assert charge_of(m, PREP, "complete", 200) == 140, mode
    m = _meter(output=500)  # the stream showed more than the estimate: the most of them
    m.usage = None
    m.problem("usage_missing", "x")
    assert charge_of(m, PREP, "complete", 200) == max(40 + m.output, 530) > 140
    m = _meter()
    assert charge_of(m, PREP, "timeout", 200) == 140


def test_a_client_that_left_is_charged_what_was_produced() -> None:
    m = _meter(upto=400)  # a few chunks, no usage yet
    m.flush()
    assert m.usage is None and 0 < m.output < 10
    assert charge_of(m, PREP, "left", 200) == 40 + m.output


def test_upstream_failures() -> None:
    m = _meter(upto=0)
    assert charge_of(m, PREP, "broken", 200) is None  # broke before any token: cancelled
    m = _meter(upto=400)
    m.flush()
    assert charge_of(m, PREP, "broken", 200) == 40 + m.output > 40
    m = _meter(upto=0)
    m.close()
    assert charge_of(m, PREP, "complete", 503) is None
    assert charge_of(m, PREP, "complete", 400) == 0
    m.usage, m.problems = TokenUsage(5, 0, 5), {}
    assert charge_of(m, PREP, "complete", 400) == 5
