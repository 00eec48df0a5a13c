"""The pacing rules, on a ``ManualClock`` the pacer's sleep moves (no sockets)."""

from __future__ import annotations

import logging
import math

import pytest

from ratekeeper import ConfigError, ManualClock
from ratekeeper.client import Retries, RetryBudget, WaitTooLong, by_header, by_path_segments
from ratekeeper.client.core import PacerCore
from ratekeeper.client.request import outgoing
from tests.client.fake import URL, Fake, call, pacer

NOW = 1_700_000_000.0


def ietf(q: int, w: int, r: int, t: int) -> dict[str, str]:
    return {"RateLimit-Policy": f'"p";q={q};w={w}', "RateLimit": f'"p";r={r};t={t}'}


def test_a_spent_quota_waits_for_its_reset() -> None:
    clock = ManualClock(NOW)
    server = Fake(clock, lambda n, h: (200, ietf(3, 60, max(0, 3 - n), 60)))
    p = pacer(clock, headroom=1.0, burst=3)
    for _ in range(4):
        call(p, server)
    assert server.sent[:3] == [NOW, NOW, NOW]  # within the burst: at once
    assert server.sent[3] >= NOW + 60  # the fourth waits for the reset
    assert p.stats()["waited"] == 1


def test_max_wait_raises_naming_the_quota_or_sends_anyway() -> None:
    clock = ManualClock(NOW)
    server = Fake(clock, lambda n, h: (200 if n == 1 else 429, ietf(1, 3600, 0, 3600)))
    p = pacer(clock, max_wait=5)
    call(p, server)
    with pytest.raises(WaitTooLong, match="quota 'p'") as caught:
        call(p, server)
    assert caught.value.wait_seconds > 5 and caught.value.max_wait == 5
    assert clock() == NOW  # it did not wait in vain
    assert len(server.sent) == 1
    sender = pacer(clock, max_wait=5, on_max_wait="send")
    call(sender, server)
    assert call(sender, server).status == 429  # sent at once: the server decides
    assert sender.stats()["sent_anyway"] == 1


def test_a_request_may_set_its_own_max_wait() -> None:
    clock = ManualClock(NOW)
    server = Fake(clock, lambda n, h: (200, ietf(1, 10, 0, 10)))
    p = pacer(clock, max_wait=1)
    call(p, server)
    call(p, server, headers={"Ratekeeper-Max-Wait": "30"})
    assert server.sent[1] >= NOW + 10


def _answered_once(core: PacerCore, r: int, q: int = 10) -> None:
    """A first request and its answer: the partition's slow start is over."""
    probe = core.open(outgoing("GET", URL, []))
    assert core.try_send(probe, NOW) == 0
    headers = {"ratelimit-policy": f'"p";q={q};w=60', "ratelimit": f'"p";r={r};t=60'}
    core.answered(probe, 200, headers, NOW)


def test_until_the_first_answer_one_request_at_a_time() -> None:
    core = PacerCore()
    request = outgoing("GET", URL, [])
    first, second = core.open(request), core.open(request)
    assert core.try_send(first, NOW) == 0
    assert core.try_send(second, NOW) > 0  # slow start: the first answer teaches the policy
    core.answered(first, 200, {}, NOW)  # a server that says nothing: no more waiting
    assert core.try_send(second, NOW) == 0
    assert core.try_send(core.open(request), NOW) == 0


def test_requests_in_flight_are_taken_from_what_is_left() -> None:
    core = PacerCore(headroom=1.0, burst=100)
    _answered_once(core, r=9)
    request = outgoing("GET", URL, [])
    tickets = [core.open(request) for _ in range(4)]
    for t in tickets:
        assert core.try_send(t, NOW) == 0
    # the first answer says 5 are left; three others are still in flight: 2 may go
    headers = {"ratelimit-policy": '"p";q=10;w=60', "ratelimit": '"p";r=5;t=60'}
    core.answered(tickets[0], 200, headers, NOW)
    more = [core.open(request) for _ in range(3)]
    assert [core.try_send(t, NOW) for t in more[:2]] == [0, 0]
    assert core.try_send(more[2], NOW) > 0


def test_an_older_answer_does_not_overwrite_a_newer_count() -> None:
    core = PacerCore(headroom=1.0, burst=100)
    _answered_once(core, r=9)
    request = outgoing("GET", URL, [])
    a, b = core.open(request), core.open(request)
    core.try_send(a, NOW)
    core.try_send(b, NOW)
    policy = '"p";q=10;w=60'
    core.answered(b, 200, {"ratelimit-policy": policy, "ratelimit": '"p";r=1;t=60'}, NOW)
    core.answered(a, 200, {"ratelimit-policy": policy, "ratelimit": '"p";r=2;t=60'}, NOW)
    c, d = core.open(request), core.open(request)
    assert core.try_send(c, NOW) == 0
    assert core.try_send(d, NOW) > 0  # 1 left, as the newer answer said


def test_higher_priority_goes_first() -> None:
    core = PacerCore(headroom=1.0, burst=1)
    _answered_once(core, r=0, q=1)
    low = core.open(outgoing("GET", URL, []))
    high = core.open(outgoing("GET", URL, [("Ratekeeper-Priority", "5")]))
    assert core.try_send(low, NOW) > 0 and core.try_send(high, NOW) > 0
    later = NOW + 60
    assert core.try_send(low, later) > 0  # ready, but a higher priority is ready too
    assert core.try_send(high, later) == 0
    assert core.try_send(low, later) > 0  # and the quota is spent again


def test_the_pace_spreads_a_window_over_its_length() -> None:
    clock = ManualClock(NOW)
    server = Fake(clock, lambda n, h: (200, ietf(10, 1, 9, 1)))
    p = pacer(clock, headroom=0.9, burst=1)
    for _ in range(10):
        call(p, server)
    gaps = [b - a for a, b in zip(server.sent[1:], server.sent[2:], strict=False)]
    assert all(math.isclose(g, 1 / 9, rel_tol=1e-6) for g in gaps)


def test_reactive_backoff_when_the_server_says_nothing() -> None:
    clock = ManualClock(NOW)
    server = Fake(clock, lambda n, h: (429 if n <= 3 else 200, {}))
    p = pacer(clock, retries=Retries(attempts=5, backoff_seconds=1, jitter=0))
    assert call(p, server).status == 200
    assert [s - NOW for s in server.sent] == [0, 1, 3, 7]  # 1 s, 2 s, 4 s
    assert p.stats()["reactive"] == 3


def test_retry_after_as_an_http_date_blocks_the_partition() -> None:
    clock = ManualClock(NOW)  # 2023-11-14T22:13:20Z
    answers = {1: (429, {"Retry-After": "Tue, 14 Nov 2023 22:13:50 GMT"})}
    server = Fake(clock, lambda n, h: answers.get(n, (200, {})))
    p = pacer(clock, retries=Retries(jitter=0))
    assert call(p, server).status == 200
    assert server.sent == [NOW, NOW + 30]


def test_only_idempotent_or_keyed_requests_are_retried() -> None:
    clock = ManualClock(NOW)
    server = Fake(clock, lambda n, h: (429, {"Retry-After": "1"}))
    p = pacer(clock, max_wait=600)
    assert call(p, server, "POST").status == 429
    assert len(server.sent) == 1
    call(p, server, "POST", {"Idempotency-Key": "abc"})
    assert len(server.sent) == 1 + 3  # three attempts
    call(p, server, "PUT", replayable=False)  # a body that cannot be sent twice
    assert len(server.sent) == 5


def test_the_retry_budget_stops_a_storm() -> None:
    clock = ManualClock(NOW)
    server = Fake(clock, lambda n, h: (429, {"Retry-After": "1"}))
    p = pacer(clock, max_wait=3600, retries=Retries(attempts=10, budget=RetryBudget(10, 0.1)))
    for _ in range(20):
        call(p, server)
    # retries stop once half the budget is gone: 4 retries, then one attempt per request
    assert p.stats()["retries"] == 4
    assert len(server.sent) == 24
    assert p.stats()["retries_denied"] >= 1


def test_retries_wait_at_least_retry_after_plus_jitter() -> None:
    clock = ManualClock(NOW)
    server = Fake(clock, lambda n, h: (503, {"Retry-After": "10"}) if n == 1 else (200, {}))
    p = pacer(clock)  # random() is 0.5, jitter 0.2: 1 s more
    call(p, server)
    assert server.sent == [NOW, NOW + 11]


def test_a_503_without_retry_after_is_not_retried() -> None:
    clock = ManualClock(NOW)
    server = Fake(clock, lambda n, h: (503, {}))
    p = pacer(clock)
    assert call(p, server).status == 503
    assert len(server.sent) == 1


def test_token_budgets_wait_for_the_tokens_a_request_declares() -> None:
    clock = ManualClock(NOW)
    used = [0]

    def reply(n: int, headers: dict[str, str]) -> tuple[int, dict[str, str]]:
        used[0] += 300  # the actual usage, more than declared: the answer corrects it
        return 200, {
            "x-ratelimit-limit-tokens": "1000",
            "x-ratelimit-remaining-tokens": str(max(0, 1000 - used[0])),
            "x-ratelimit-reset-tokens": "1m0s",
        }

    server = Fake(clock, reply)
    p = pacer(clock, max_wait=600)
    for _ in range(4):
        call(p, server, "POST", {"Ratekeeper-Tokens": "200"})
    # 1000 tokens, 300 used per request: the fourth waits for tokens to come back
    assert server.sent[3] > NOW
    assert [q.unit for q in p.policies()] == ["tokens"]


def test_a_wait_over_the_threshold_is_logged(caplog: pytest.LogCaptureFixture) -> None:
    clock = ManualClock(NOW)
    server = Fake(clock, lambda n, h: (200, ietf(1, 5, 0, 5)))
    p = pacer(clock, log_wait_seconds=2.0)
    with caplog.at_level(logging.INFO, "ratekeeper.client"):
        call(p, server)
        call(p, server)
    (record,) = caplog.records
    assert "waited 5.00 s before GET https://api.example.com/v1/items" in record.getMessage()
    assert "quota 'p'" in record.getMessage()
    assert p.stats()["waits_logged"] == 1 and p.stats()["wait_seconds"] == 5


def test_partitions_pace_apart() -> None:
    clock = ManualClock(NOW)
    server = Fake(clock, lambda n, h: (200, ietf(1, 60, 0, 60)))
    p = pacer(clock, partition=by_path_segments(1), max_wait=1)
    call(p, server, url="https://api.example.com/search/code")
    call(p, server, url="https://api.example.com/repos/x")  # another partition: not spent
    with pytest.raises(WaitTooLong):
        call(p, server, url="https://api.example.com/search/issues")
    keyed = pacer(clock, partition=by_header("Authorization"), max_wait=1)
    call(keyed, server, headers={"Authorization": "token a"})
    call(keyed, server, headers={"Authorization": "token b"})
    parts = {policy.partition for policy in keyed.policies()}
    assert len(parts) == 2 and not any("token" in part for part in parts)


def test_a_bad_partition_function_or_request_header_is_loud() -> None:
    clock = ManualClock(NOW)
    server = Fake(clock, lambda n, h: (200, {}))

    def broken(request: object) -> str:
        raise KeyError("tenant")

    with pytest.raises(ConfigError, match="partition function"):
        call(pacer(clock, partition=broken), server)
    with pytest.raises(ConfigError, match="returned 42"):
        call(pacer(clock, partition=lambda r: 42), server)  # type: ignore[arg-type,return-value]
    for name, value in (("Ratekeeper-Tokens", "many"), ("Ratekeeper-Priority", "9999"),
                        ("Ratekeeper-Max-Wait", "nan")):  # fmt: skip
        with pytest.raises(ConfigError, match=name.lower()):
            call(pacer(clock), server, headers={name: value})
    assert server.sent == []


@pytest.mark.parametrize(
    "options",
    [{"headroom": 0}, {"headroom": 2}, {"burst": 0}, {"max_wait": -1}, {"on_max_wait": "wait"},
     {"partition": "host"}, {"retries": 3}, {"clock": 5}, {"sleep": None}, {"shared": "redis"}],
)  # fmt: skip
def test_bad_options_are_refused(options: dict[str, object]) -> None:
    from ratekeeper.client import Pacer

    with pytest.raises(ConfigError):
        Pacer(**options)  # type: ignore[arg-type]


def test_a_request_names_its_partition_for_calls_the_url_does_not_tell_apart() -> None:
    clock = ManualClock(NOW)
    server = Fake(clock, lambda n, h: (200, ietf(1, 60, 0, 60)))
    p = pacer(clock, max_wait=1)
    search = {"Ratekeeper-Partition": "api.search"}
    call(p, server, "POST", search)
    call(p, server, "POST", {"Ratekeeper-Partition": "api.core"})  # its own budget
    with pytest.raises(WaitTooLong):
        call(p, server, "POST", search)
    with pytest.raises(ConfigError, match="ratekeeper-partition"):
        call(p, server, "POST", {"Ratekeeper-Partition": "x" * 300})


def test_a_refilling_rate_is_learned_from_the_finest_answer() -> None:
    from ratekeeper.client.budget import Budget
    from ratekeeper.client.headers import Quota

    budget = Budget("tokens", "tokens", None)
    # 150000 a minute: 4000 missing is 1.6 s to full; 16 missing, 6.4 ms, rounded to 6 ms
    budget.observe(Quota("tokens", "tokens", 150000, None, 146000, 1.6, refills=True), NOW, 1)
    budget.observe(Quota("tokens", "tokens", 150000, None, 149984, 0.006, refills=True), NOW, 2)
    assert budget.window_seconds == 60.0
    # a new limit is learned anew, whatever its reset
    budget.observe(Quota("tokens", "tokens", 75000, None, 74000, 0.64, refills=True), NOW, 3)
    assert budget.window_seconds == 48.0


def test_a_shared_window_counts_every_process_sends_since_the_answer() -> None:
    from ratekeeper.client.budget import Budget
    from ratekeeper.client.headers import Quota

    seen = Quota("p", "requests", 100, 1.0, 5, 1.0)
    alone, pooled = Budget("p", "requests", None), Budget("p", "requests", None, pooled=0.97)
    for budget in (alone, pooled):
        budget.observe(seen, NOW + 0.01, 1, 1.0, sent_at=NOW)
    # 5 left when the request was sent; 50 ms later the other processes may have sent 4.85
    later = NOW + 0.05
    assert alone.delay(1, later, 0.97, 1) == 0
    assert pooled.delay(1, later, 0.97, 1) == pytest.approx(NOW + 1.01 - later)
    # its own sends are in that rate: taking one changes nothing
    left = pooled.left_now(later)
    pooled.take(1, later, 0.97)
    assert pooled.left_now(later) == left


def test_past_a_reset_one_request_goes_alone_until_an_answer_confirms_it() -> None:
    # regression: a token bucket's reset is when it would be full had nothing been sent; the
    # budget took the limit as left at the earliest reset and let concurrent callers burst
    from ratekeeper.client.budget import Budget
    from ratekeeper.client.headers import Quota

    budget = Budget("p", "requests", None)
    budget.observe(Quota("p", "requests", 20, 1.0, 0, 1.0), NOW, 1)
    later = NOW + 1.0
    assert budget.delay(1, later, 0.97, None) == 0
    budget.take(1, later, 0.97)
    assert budget.delay(1, later, 0.97, None) > 0  # the first past the reset is in flight
    budget.answered(1)
    budget.observe(Quota("p", "requests", 20, 1.0, 2, 1.0), later, 2)
    assert budget.delay(1, later, 0.97, None) == 0  # confirmed: 2 left


def test_a_content_bytes_quota_is_charged_the_body_length() -> None:
    core = PacerCore(headroom=1.0)
    probe = core.open(outgoing("PUT", URL, []))
    core.try_send(probe, NOW)
    policy = '"up";q=1000;w=60;qu="content-bytes"'
    core.answered(probe, 200, {"ratelimit-policy": policy, "ratelimit": '"up";r=300;t=60'}, NOW)
    small = core.open(outgoing("PUT", URL, [], body_bytes=200))
    large = core.open(outgoing("PUT", URL, [], body_bytes=200))
    assert core.try_send(small, NOW) == 0
    assert core.try_send(large, NOW) > 0  # 100 bytes left of the window
