"""Hostile or contradictory headers, property-tested through the whole pacer: never an
exception (but the ``WaitTooLong`` the caller chose), never a wait past ``max_wait``."""

from __future__ import annotations

from hypothesis import assume, given, settings
from hypothesis import strategies as st

from ratekeeper import ManualClock
from ratekeeper.client import Retries, WaitTooLong
from ratekeeper.client.headers import header_map, read
from tests.client.fake import Fake, call, pacer
from tests.client.test_headers import HEADER_NAMES, VALUES

NOW = 1_700_000_000.0
NUMBERS = st.sampled_from(["0", "1", "5", "60", "3600", "1700000000", "1700003600", "99999999",
                           "-1", "1e9", "nan", "", "0.001", "86400000"])  # fmt: skip
STRUCTURED = st.builds(
    lambda q, w, r, t: {"ratelimit-policy": f'"p";q={q};w={w}', "ratelimit": f'"p";r={r};t={t}'},
    NUMBERS, NUMBERS, NUMBERS, NUMBERS,
)  # fmt: skip
ANY = st.dictionaries(st.sampled_from(HEADER_NAMES), VALUES, max_size=6)
REPLY = st.tuples(st.sampled_from([200, 200, 429, 503]), st.one_of(STRUCTURED, ANY))


@settings(max_examples=150)
@given(
    st.lists(REPLY, min_size=1, max_size=12),
    st.sampled_from(["raise", "send"]),
    st.sampled_from([0.0, 0.5, 5.0, 30.0]),
    st.sampled_from(["GET", "POST"]),
)
def test_never_an_exception_never_past_max_wait(
    replies: list[tuple[int, dict[str, str]]], on_max_wait: str, max_wait: float, method: str
) -> None:
    clock = ManualClock(NOW)
    server = Fake(clock, lambda n, h: replies[(n - 1) % len(replies)])
    p = pacer(clock, max_wait=max_wait, on_max_wait=on_max_wait, retries=Retries(attempts=4))
    for _ in range(len(replies) + 2):
        began = clock()
        try:
            call(p, server, method)
        except WaitTooLong as exc:
            assert on_max_wait == "raise"
            assert exc.wait_seconds > max_wait - (clock() - began) - 1e-9
        assert clock() - began <= max_wait + 1e-6


@given(st.lists(ANY, min_size=1, max_size=8))
def test_headers_that_say_nothing_usable_leave_it_reactive(answers: list[dict[str, str]]) -> None:
    clock = ManualClock(NOW)
    usable = [read(header_map(h.items()), NOW) for h in answers]
    assume(not any(seen.quotas or seen.retry_after_seconds is not None for seen in usable))
    server = Fake(clock, lambda n, h: (200, answers[(n - 1) % len(answers)]))
    p = pacer(clock, max_wait=5.0)
    for _ in range(len(answers) + 3):
        call(p, server)
    assert clock() == NOW and p.stats()["waited"] == 0  # nothing learned: nothing waited for
