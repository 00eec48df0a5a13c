"""The fast hit (``engine.fast.FastHits``, rendered by ``http.hit.rendered``) answers exactly
as the general path: the same
body, headers, decisions and metrics for the same traffic, whatever the algorithm, policy name
and time; and a reload or a toggle is seen at once."""

from __future__ import annotations

import asyncio
from collections.abc import MutableMapping
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from ratekeeper import AsyncLimiter, ManualClock, MemoryStore
from ratekeeper.service.config import loader as config
from ratekeeper.service.config.policies import PolicySpec
from ratekeeper.service.engine import Engine, Result
from ratekeeper.service.engine.fast import FastHits
from ratekeeper.service.http.api import HttpApi
from ratekeeper.service.http.hit import HeaderList, ms_json, rendered
from ratekeeper.service.http.render import _result_body
from ratekeeper.service.metrics import InstrumentedLocalStore, Metrics

CONFIG = """\
policies:
  fixed:
    rate: 3/second
  "café.v-1:x":
    rate: 2/10s
    algorithm: sliding_window
  bucket:
    rate: 4/minute
    algorithm: token_bucket
    burst: 2
  cell:
    rate: 5/second
    algorithm: gcra
  log:
    rate: 2/second
    algorithm: sliding_log
  stack:
    rate: 2/second; 5/minute
"""
NAMES = ["fixed", "café.v-1:x", "bucket", "cell", "log", "stack"]
JSON = (b"content-type", b"application/json")


def make(clock: ManualClock, text: str = CONFIG) -> Engine:
    metrics = Metrics()
    limiter = AsyncLimiter(InstrumentedLocalStore(MemoryStore(), metrics), clock=clock)
    return Engine(config.parse_text(text), limiter, metrics, clock)


def general(engine: Engine, name: str, key: str, cost: int) -> tuple[bool, bytes, list[Any]]:
    """What the general path answers: (allowed, body, headers as sent)."""
    spec = engine.config.policies[name]
    stored = f"{len(spec.name)}:{spec.name}:{key}"
    result = engine.decide_now("hit", spec, key, cost, stored)
    if result is None:
        result = asyncio.run(engine.ask("hit", spec, key, cost, stored))
    return respond(result)


def respond(result: Result) -> tuple[bool, bytes, list[Any]]:
    body = _result_body(result)
    headers = [*result.decision.header_lines(result.policy), JSON]
    headers.append((b"content-length", b"%d" % len(body)))
    return result.decision.allowed, body, headers


class HttpHits:
    """A fast hit as the HTTP API answers it: the engine's, rendered."""

    def __init__(self, engine: Engine) -> None:
        self.engine = engine
        self.fast = FastHits(engine)

    def answer(
        self, spec: PolicySpec, key: str, cost: int
    ) -> tuple[bytes, HeaderList | bytes] | Result | None:
        made = self.fast.hit(spec, key, cost)
        if made is None or isinstance(made, Result):
            return made
        return rendered(made)


def fast(hits: HttpHits, name: str, key: str, cost: int) -> tuple[bool, bytes, list[Any]]:
    spec = hits.engine.config.policies[name]
    answer = hits.answer(spec, key, cost)
    if answer is None:  # a policy of several rates: the general path
        return general(hits.engine, name, key, cost)
    if isinstance(answer, Result):
        return respond(answer)
    body, headers = answer
    assert isinstance(headers, list)  # the list form: block not asked
    return True, body, headers


@settings(max_examples=150, deadline=None)
@given(
    start=st.floats(min_value=0, max_value=4e9),
    steps=st.lists(
        st.tuples(
            st.sampled_from(NAMES),
            st.sampled_from(["k", "other"]),
            st.integers(1, 4),
            st.sampled_from([0, 0, 0.0004, 0.3, 1, 7.5, 61]),
        ),
        max_size=40,
    ),
)
def test_fast_hits_answer_as_the_general_path(
    start: float, steps: list[tuple[str, str, int, float]]
) -> None:
    clock = ManualClock(start)
    one, two = make(clock), make(clock)
    hits = HttpHits(one)
    for name, key, cost, advance in steps:
        clock.advance(advance)
        assert fast(hits, name, key, cost) == general(two, name, key, cost)
    for name in NAMES:
        for outcome in ("allowed", "rejected", "local_rejected"):
            assert one.metrics.count_of(name, outcome) == two.metrics.count_of(name, outcome)
    latency = [one.metrics.store_latency.histograms(), two.metrics.store_latency.histograms()]
    assert [h[1][-1] for h in latency[0]] == [h[1][-1] for h in latency[1]]


def test_a_reload_or_a_toggle_is_seen_by_the_next_hit() -> None:
    clock = ManualClock(1_800_000_000.0)
    engine = make(clock)
    hits = HttpHits(engine)
    assert fast(hits, "fixed", "k", 1)[2][0] == (b"x-ratelimit-limit", b"3")
    engine.swap(config.parse_text(CONFIG.replace("3/second", "7/second")))
    assert fast(hits, "fixed", "k", 1)[2][0] == (b"x-ratelimit-limit", b"7")
    engine.toggle("fixed", False, None)  # off: engine.spec gives a copy, the fast hit declines
    assert hits.answer(engine.spec("fixed"), "k", 1) is None
    engine.swap(config.parse_text(CONFIG))
    assert fast(hits, "fixed", "k", 1)[2][0] == (b"x-ratelimit-limit", b"3")


def test_an_over_limit_cache_entry_sends_hits_the_general_way() -> None:
    clock = ManualClock(1_800_000_000.0)
    engine = make(clock)
    hits = HttpHits(engine)
    answers = [fast(hits, "fixed", "k", 1)[0] for _ in range(4)]
    assert answers == [True, True, True, False]
    spec = engine.config.policies["fixed"]
    assert hits.answer(spec, "k", 1) is None  # cached: decide_now answers it locally
    assert engine.decide_now("hit", spec, "k", 1, "5:fixed:k").local  # type: ignore[union-attr]


def test_the_http_api_answers_hits_through_it() -> None:
    clock = ManualClock(1_800_000_000.0)
    engine = make(clock)

    async def none() -> Any:
        return None

    api = HttpApi(engine, none, none)
    sent: list[MutableMapping[str, Any]] = []
    body = b'{"policy":"fixed","key":"k"}'

    async def receive() -> dict[str, Any]:
        return {"type": "http.request", "body": body, "more_body": False}

    async def send(message: MutableMapping[str, Any]) -> None:
        sent.append(message)

    headers = [(b"content-type", b"application/json")]
    scope = {"type": "http", "path": "/v1/hit", "method": "POST", "headers": headers}
    asyncio.run(api(scope, receive, send))
    assert sent[0]["status"] == 200
    assert general(make(clock), "fixed", "k", 1) == (True, sent[1]["body"], sent[0]["headers"])
    assert engine.fast._plans  # the fast hit answered it


@given(st.integers(0, 10**15 - 1))
def test_ms_json_is_the_repr_of_the_seconds(ms: int) -> None:
    assert ms_json(ms) == repr(ms / 1000).encode()
    assert ms_json(ms // 1000 * 1000) == repr(ms // 1000 * 1000 / 1000).encode()
