"""``envoy.nested_domains``: a request's descriptors decided as one nested call (all or
nothing, in one store call), opt-in; other domains keep upstream's independent descriptors."""

from __future__ import annotations

from ratekeeper.service.envoy.rls import Descriptor
from tests.service.test_envoy import ask, make


def test_upstream_descriptors_stay_independent() -> None:
    envoy, _ = make()
    for _ in range(3):
        ask(envoy, ("user", "u1"), ("ip", "x"))
    answer = ask(envoy, ("user", "u1"), ("ip", "x"))
    assert [s.over for s in answer.statuses] == [True, False]
    # upstream charged ip on the refused request too: 4 of 10 gone
    assert answer.statuses[1].remaining == 6


def test_nested_domains_charge_every_descriptor_or_none() -> None:
    envoy, _ = make("envoy:\n  nested_domains: [edge]\n")
    for _ in range(3):
        assert not ask(envoy, ("ip", "x"), ("user", "u1")).over
    refused = ask(envoy, ("ip", "x"), ("user", "u1"))
    assert refused.over and [s.over for s in refused.statuses] == [False, True]
    # the refused request charged nothing: ip x still at 7 of 10
    alone = ask(envoy, ("ip", "x"))
    assert alone.statuses[0].remaining == 6
    # user u1 counts inside ip x: under another ip it is a counter of its own
    assert not ask(envoy, ("ip", "y"), ("user", "u1")).over
    # a limit of 0 refuses the request without charging the others
    blocked = ask(envoy, ("ip", "z"), ("blocked", "b"))
    assert blocked.over
    assert ask(envoy, ("ip", "z")).statuses[0].remaining == 9
    # a shadow limit is looked at, never refuses, never charged
    for _ in range(3):
        assert not ask(envoy, ("ip", "s"), ("shadow", "a")).over
    assert ask(envoy, ("ip", "s")).statuses[0].remaining == 6
    # another domain keeps upstream's rules
    assert not ask(envoy, Descriptor((("ip", "q"),)), hits=1).over


def test_one_descriptor_twice_is_charged_at_both_levels() -> None:
    """Two descriptors a client can make equal (two headers mapped to one descriptor key)
    are two levels of the nested call, each charged: it raised ``ConfigError`` ("level 2
    repeats level 1"), and the request went unanswered by the limits."""
    envoy, _ = make("envoy:\n  nested_domains: [edge]\n")
    seen = [ask(envoy, ("ip", "x"), ("user", "u1"), ("user", "u1")) for _ in range(4)]
    assert [a.over for a in seen] == [False, False, False, True]
    assert [s.remaining for s in seen[2].statuses] == [7, 0, 0]
    assert ask(envoy, ("ip", "x")).statuses[0].remaining == 6  # the refused one charged nothing
