"""The reply encoder against protobuf's own encoding of the same answer."""

from __future__ import annotations

from fractions import Fraction
from typing import Any

from envoy.service.ratelimit.v3 import rls_pb2 as pb
from hypothesis import given, settings
from hypothesis import strategies as st

from ratekeeper.service.envoy.reply import ReplyEncoder, varint
from ratekeeper.service.envoy.rls import Answer, Status

Response = pb.RateLimitResponse


def reference(answer: Answer) -> bytes:
    """The answer as a ``RateLimitResponse`` built field by field, serialized by protobuf."""
    response: Any = Response(overall_code=Response.OVER_LIMIT if answer.over else Response.OK)
    for s in answer.statuses:
        status = response.statuses.add(
            code=Response.OVER_LIMIT if s.over else Response.OK, limit_remaining=s.remaining
        )
        if s.limit is not None:
            requests, unit, name = s.limit
            status.current_limit.requests_per_unit = min(requests, 2**32 - 1)
            status.current_limit.unit = unit
            status.current_limit.name = name
            nanos = round(Fraction(s.reset) * 10**9)  # exact: the nearest nanosecond
            status.duration_until_reset.seconds = nanos // 10**9
            status.duration_until_reset.nanos = nanos % 10**9
    for k, v in answer.headers:
        response.response_headers_to_add.add(key=k, value=v)
    if answer.metadata is not None:
        response.dynamic_metadata.update(answer.metadata)
    return response.SerializeToString()  # type: ignore[no-any-return]


LIMITS = st.one_of(
    st.none(),
    st.tuples(st.integers(0, 2**40), st.integers(0, 6), st.text(max_size=40)),
)
STATUSES = st.builds(
    Status,
    over=st.booleans(),
    remaining=st.one_of(st.integers(0, 300), st.integers(0, 2**32 - 1)),
    limit=LIMITS,
    reset=st.one_of(
        st.integers(0, 100_000).map(float),
        st.floats(0, 10**9, allow_nan=False, allow_infinity=False),
        st.integers(0, 10**6).map(lambda n: n + 0.9999999999),  # rounds up to a second
        st.sampled_from([0.0, 0.5, 1e-10, 1e-9, 2**52 + 0.5]),
    ),
    result=st.none(),
)
ANSWERS = st.builds(
    Answer,
    over=st.booleans(),
    statuses=st.lists(STATUSES, max_size=5),
    headers=st.lists(st.tuples(st.text(max_size=20), st.text(max_size=20)), max_size=3),
    metadata=st.one_of(
        st.none(), st.dictionaries(st.text(max_size=8), st.text(max_size=8), max_size=3)
    ),
)


@settings(max_examples=500)
@given(answer=ANSWERS)
def test_the_bytes_are_protobufs(answer: Answer) -> None:
    encoder = ReplyEncoder()
    first = encoder.encode(answer)
    assert first == reference(answer)
    assert encoder.encode(answer) == first  # with the limits' bytes kept


def test_the_usual_answer_decodes() -> None:
    status = Status(False, 999_999_123, (1_000_000_000, 4, "bench/user"), 1234.5)
    raw = ReplyEncoder().encode(Answer(False, [status], []))
    back = Response.FromString(raw)
    assert back.overall_code == Response.OK and len(back.statuses) == 1
    got = back.statuses[0]
    assert got.limit_remaining == 999_999_123 and got.current_limit.name == "bench/user"
    assert (got.duration_until_reset.seconds, got.duration_until_reset.nanos) == (1234, 5 * 10**8)


@given(n=st.integers(0, 2**64 - 1))
def test_varint(n: int) -> None:
    from google.protobuf.internal.encoder import _VarintBytes

    assert varint(n) == _VarintBytes(n)
