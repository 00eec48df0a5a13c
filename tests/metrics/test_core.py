"""The in-process recorder: counting, label bounds, watched gauges, the Space-Saving sketch."""

from __future__ import annotations

import gc
import random
from collections import Counter

import pytest

from ratekeeper import ConfigError, Limiter, ManualClock, WorkerUtilizationShedder
from ratekeeper.metrics import METRICS, OUTCOMES, Metrics, SpaceSaving
from ratekeeper.metrics.core import OTHER


def test_vocabulary_names_are_unique_and_prefixed() -> None:
    names = [s.name for s in METRICS]
    assert len(set(names)) == len(names)
    assert all(n.startswith("ratekeeper_") and not n.endswith("_total") for n in names)
    assert "rejected" in OUTCOMES and "degraded" in OUTCOMES


def test_decisions_are_counted_by_policy_and_outcome() -> None:
    m = Metrics()
    for _ in range(3):
        m.decision("api", "allowed")
    m.decision("api", "rejected")
    assert m.count_of("api", "allowed") == 3
    assert m.count_of("api", "rejected") == 1
    assert dict(m.decisions.samples()) == {("api", "allowed"): 3, ("api", "rejected"): 1}


def test_label_sets_past_the_cap_fold_into_other() -> None:
    m = Metrics(max_series=5)
    for i in range(100):
        m.decision(f"p{i}", "allowed")
    samples = dict(m.decisions.samples())
    assert len(samples) == 6  # 5 real series, then one _other
    assert samples[(OTHER, OTHER)] == 95
    assert len(m._cells) <= 5  # the hot-path cache is bounded too


def test_wrong_label_count_is_a_clear_error() -> None:
    with pytest.raises(ConfigError, match="ratekeeper_decisions takes labels"):
        Metrics().decisions.labels("only-one")


def test_histogram_buckets_are_cumulative() -> None:
    m = Metrics()
    for value in (0.00005, 0.0003, 0.0003, 0.2, 9.0):
        m.store_latency.observe(value)
    [(labels, cumulative, total)] = m.store_latency.histograms()
    assert labels == ()
    assert cumulative[0] == 1  # <= 0.0001
    assert cumulative[2] == 3  # <= 0.0005
    assert cumulative[-2] == 4  # <= 0.5
    assert cumulative[-1] == 5  # +Inf
    assert total == pytest.approx(9.20065)


def test_limiter_counts_decisions_times_store_calls_and_watches_breakers() -> None:
    m = Metrics()
    clock = ManualClock()
    limiter = Limiter(clock=clock, metrics=m)
    got = [limiter.hit("k", "2/minute").allowed for _ in range(3)]
    assert got == [True, True, False]
    assert m.count_of("2/1m", "allowed") == 2
    assert m.count_of("2/1m", "rejected") == 1
    limiter.hit("k", "2/second; 10/minute")  # a stack: the full path, one store call
    assert m.count_of("2/1s; 10/1m", "allowed") == 1
    assert m.store_latency.histograms()[0][1][-1] >= 1
    assert dict(m.breaker_state.samples()) == {("memory", "0", "rate"): 0.0}


class Broken:
    """A store that always fails."""

    def execute(self, plan: object) -> tuple[()]:
        raise ConnectionError("down")


def test_failing_store_shows_as_degraded_errors_and_an_open_breaker() -> None:
    m = Metrics()
    limiter = Limiter(Broken(), clock=ManualClock(), metrics=m)  # type: ignore[arg-type]
    for _ in range(5):
        assert limiter.hit("k", "5/minute").degraded
    assert m.count_of("5/1m", "degraded") == 5
    assert dict(m.store_errors.samples())[()] == 3  # then the breaker stops the calls
    assert dict(m.breaker_state.samples()) == {("Broken", "0", "rate"): 2.0}


def test_count_decisions_false_leaves_counting_to_the_caller() -> None:
    m = Metrics()
    Limiter(metrics=m, count_decisions=False).hit("k", "1/minute")
    assert m.decisions.samples() == []


def test_discarded_limiters_stop_being_exported() -> None:
    m = Metrics()
    limiter = Limiter(metrics=m)
    assert m.breaker_state.samples()
    del limiter
    gc.collect()
    assert m.breaker_state.samples() == []


def test_breaker_states_of_two_sources_combine_to_the_worst() -> None:
    m = Metrics()
    states = [{"0": "closed"}, {"0": "open"}]
    m.watch_breakers(lambda: states[0], "redis")
    m.watch_breakers(lambda: states[1], "redis")
    assert dict(m.breaker_state.samples()) == {("redis", "0", "rate"): 2.0}


def test_shedder_drop_probabilities_are_watched() -> None:
    clock = ManualClock()
    shedder = WorkerUtilizationShedder(clock=clock)
    m = Metrics()
    m.watch_shedder("workers", shedder)
    for _ in range(100):  # saturated for 100 s: the test tier is fully shed by t=68 s
        shedder.update(1.0)
        clock.advance(1.0)
    probs = {labels[1]: p for labels, p in m.shed_drop.samples()}
    assert probs["critical"] == 0.0
    assert probs["test"] == 1.0
    assert probs == {t: shedder.drop_probability(t) for t in shedder.tiers}
    m.watch_shedder("custom", lambda: {"low": 0.25})
    assert dict(m.shed_drop.samples())[("custom", "low")] == 0.25


def test_space_saving_finds_every_heavy_hitter() -> None:
    rng = random.Random(7)
    stream = [f"heavy{i}" for i in range(5) for _ in range(300)]
    stream += [f"light{rng.randrange(5000)}" for _ in range(3000)]
    rng.shuffle(stream)
    sketch = SpaceSaving(capacity=32)
    for item in stream:
        sketch.add("p", item)
    truth = Counter(stream)
    top = sketch.top(5)
    assert {h.item for h in top} == {f"heavy{i}" for i in range(5)}
    for h in top:  # never under, and over by at most the recorded error
        assert truth[h.item] <= h.count <= truth[h.item] + h.error
    assert len(sketch) == 32


def test_rejected_keys_feed_the_sketch_when_kept() -> None:
    m = Metrics(top_keys=4)
    m.decision("api", "allowed", "a")
    m.decision("api", "rejected", "b")
    m.decision("api", "shadow_rejected", "b")
    assert [(h.group, h.item, h.count) for h in m.top.top()] == [("api", "b", 2)]  # type: ignore[union-attr]
    assert SpaceSaving(max_len=3).max_len == 3
    long = SpaceSaving(max_len=3)
    long.add("p", "abcdef")
    assert long.top()[0].item == "abc…"


def test_space_saving_remembers_when_each_key_was_first_and_last_counted() -> None:
    now = [100.0]
    sketch = SpaceSaving(capacity=2, clock=lambda: now[0])
    sketch.add("p", "a")
    now[0] = 130.0
    sketch.add("p", "a")
    sketch.add("p", "b")
    now[0] = 160.0
    sketch.add("p", "c")  # replaces b (the smallest): c is first seen now, not when b was
    by_item = {h.item: h for h in sketch.top(5)}
    assert (by_item["a"].first_seen, by_item["a"].last_seen) == (100.0, 130.0)
    assert (by_item["c"].first_seen, by_item["c"].last_seen, by_item["c"].error) == (
        160.0,
        160.0,
        1,
    )
    assert "b" not in by_item
