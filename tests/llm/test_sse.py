"""SSEParser: events come out the same however the bytes are cut, within a memory bound."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from ratekeeper.llm import Event, SSEParser

TEXT = st.text(
    st.characters(blacklist_categories=("Cs",), blacklist_characters="\r\n"), max_size=30
)
EVENTS = st.lists(
    st.tuples(
        st.sampled_from(["", "message_start", "content_block_delta", "ünïcödé"]),
        st.lists(TEXT, min_size=1, max_size=3),
    ),
    max_size=8,
)


def _wire(events: list[tuple[str, list[str]]], eol: str, comments: bool, bom: bool) -> bytes:
    out = "\ufeff" if bom else ""
    for kind, lines in events:
        if comments:
            out += f": keep-alive{eol}"
        if kind:
            out += f"event: {kind}{eol}"
        for line in lines:
            out += f"data: {line}{eol}"
        out += eol
    return out.encode()


def _cuts(data: bytes, points: list[int]) -> list[bytes]:
    points = sorted({p % (len(data) + 1) for p in points})
    chunks, last = [], 0
    for p in points:
        chunks.append(data[last:p])
        last = p
    chunks.append(data[last:])
    return chunks


def _feed(chunks: list[bytes], max_event_bytes: int = 1 << 20) -> tuple[list[Event], SSEParser]:
    parser = SSEParser(max_event_bytes)
    out: list[Event] = []
    for chunk in chunks:
        out += parser.feed(chunk)
    out += parser.close()
    return out, parser


@settings(max_examples=300, deadline=None)
@given(
    EVENTS,
    st.sampled_from(["\n", "\r", "\r\n"]),
    st.booleans(),
    st.booleans(),
    st.lists(st.integers(min_value=0, max_value=10_000), max_size=20),
)
def test_any_cut_gives_the_same_events(events, eol, comments, bom, points) -> None:  # type: ignore[no-untyped-def]
    data = _wire(events, eol, comments, bom)
    expected = [Event(kind or "message", "\n".join(lines).encode()) for kind, lines in events]
    assert _feed([data])[0] == expected
    assert _feed(_cuts(data, points))[0] == expected


@settings(max_examples=100, deadline=None)
@given(EVENTS, st.sampled_from(["\n", "\r", "\r\n"]))
def test_byte_by_byte(events, eol) -> None:  # type: ignore[no-untyped-def]
    data = _wire(events, eol, True, True)
    one = [data[i : i + 1] for i in range(len(data))]
    expected = [Event(kind or "message", "\n".join(lines).encode()) for kind, lines in events]
    assert _feed(one)[0] == expected


def test_the_whatwg_field_rules() -> None:
    data = b"data\n\ndata:no space\ndata:  two spaces\nid: 7\nretry: 10\nfoo: bar\n\n:only\n\n"
    events, _ = _feed([data])
    # "data" alone is an event of empty data (WHATWG: the buffer is "\n" before its LF goes)
    assert events == [Event("message", b""), Event("message", b"no space\n two spaces")]


def test_an_event_without_its_blank_line_is_read_at_close() -> None:
    events, _ = _feed([b'data: {"usage": 1}'])
    assert events == [Event("message", b'{"usage": 1}')]


@settings(max_examples=100, deadline=None)
@given(st.integers(min_value=1, max_value=5000), st.lists(st.integers(0, 10_000), max_size=12))
def test_an_over_long_event_is_dropped_and_the_rest_kept(size, points) -> None:  # type: ignore[no-untyped-def]
    big = b"data: " + b"x" * size + b"\n" + b"data: " + b"y" * size + b"\n\n"
    data = b"data: a\n\n" + big + b"event: e\ndata: b\n\n"
    bound = 64
    parser = SSEParser(bound)
    out: list[Event] = []
    for chunk in _cuts(data, points):
        out += parser.feed(chunk)
        assert len(parser._line) <= bound + 1 and parser._size <= bound  # memory stays bounded
    out += parser.close()
    if size + 1 <= bound and 2 * (size + 1) <= bound:
        assert len(out) == 3
    else:
        assert out == [Event("message", b"a"), Event("e", b"b")]
        assert parser.dropped == 1


def test_a_stream_of_one_endless_line_keeps_nothing() -> None:
    parser = SSEParser(1024)
    for _ in range(1000):
        assert parser.feed(b"data: " + b"z" * 4096) == []
        assert len(parser._line) <= 1025
    assert parser.feed(b"\n\ndata: ok\n\n") == [Event("message", b"ok")]
    assert parser.dropped == 1


def test_utf8_cut_mid_character() -> None:
    data = "data: héllo wörld ✓ 𝄞\n\n".encode()
    for cut in range(len(data)):
        events, _ = _feed([data[:cut], data[cut:]])
        assert events == [Event("message", "héllo wörld ✓ 𝄞".encode())]
