"""``--reject-share``: a suggestion bounded by the share of requests it rejects, not of keys.

One client sending half the traffic is one key of many: the limit that touches almost
nobody (``--share``) stops it and rejects half the requests. The bounded suggestion is the
smallest count whose replay rejects at most the share asked, and replaying it as a limit
rejects what it said, within the bound."""

from __future__ import annotations

import json
import math
import random
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ratekeeper.cli import main
from ratekeeper.simulate.advice import within_requests
from ratekeeper.simulate.suggest import Demand

START = 1_700_000_000
ALGORITHMS = ["fixed_window", "sliding_window", "sliding_log", "token_bucket", "gcra"]
HEAVY = "203.0.113.7"


def clf(t: float, ip: str, status: int = 200) -> str:
    when = datetime.fromtimestamp(t, UTC).strftime("%d/%b/%Y:%H:%M:%S +0000")
    return f'{ip} - - [{when}] "GET /api/items HTTP/1.1" {status} 64 "-" "x"\n'


def half_from_one_client(seed: int = 3) -> list[tuple[float, str]]:
    """An hour: 200 clients send a few requests each, one client about one a second
    (half of the requests)."""
    rng = random.Random(seed)
    rows = []
    for i in range(200):
        for _ in range(rng.randrange(1, 20)):
            rows.append((START + rng.uniform(0, 3600), f"10.0.{i // 100}.{i % 100}"))
    t = float(START)
    while t < START + 3600:
        rows.append((t, HEAVY))
        t += rng.uniform(0.5, 2.5)
    rows.sort()
    return rows


def report(tmp_path: Path, log: Path, *args: str) -> dict[str, Any]:
    out = tmp_path / "r.json"
    assert main(["simulate", str(log), *args, "--json", str(out), "--no-progress"]) == 0
    data: dict[str, Any] = json.loads(out.read_text())
    return data


def replayed(tmp_path: Path, log: Path, rate: str, algorithm: str) -> dict[str, Any]:
    """The limit report of ``rate`` as a candidate (no suggestions)."""
    data = report(tmp_path, log, "--limit", f"x={rate},algorithm={algorithm}", "--no-suggest")
    limit: dict[str, Any] = data["limits"][0]
    return limit


def test_one_client_with_half_the_traffic_changes_the_answer(tmp_path: Path) -> None:
    rows = half_from_one_client()
    log = tmp_path / "access.log"
    log.write_text("".join(clf(t, ip) for t, ip in rows))
    heavy = sum(1 for _, ip in rows if ip == HEAVY)
    assert 0.4 < heavy / len(rows) < 0.6
    data = report(tmp_path, log, "--limit", "per-ip=100/minute", "--share", "0.01",
                  "--reject-share", "0.01")  # fmt: skip
    assert data["reject_share"] == 0.01
    [s] = data["limits"][0]["rates"][0]["suggestions"]
    # limiting at most 1 % of the keys stops the heavy client: half the requests rejected
    assert s["stops"][0]["key"] == HEAVY and s["rejected_share"] > 0.3
    bounded = s["requests"]
    assert bounded["bound"] == 0.01 and bounded["rejected_share"] <= 0.01
    assert bounded["rejected_requests"] <= math.floor(0.01 * len(rows))
    assert bounded["count"] > s["count"]
    # replayed as a limit it rejects what it said, within the bound ...
    limit = replayed(tmp_path, log, bounded["rate"], "fixed_window")
    assert limit["requests"] == len(rows)
    assert limit["would_reject"] == bounded["rejected_requests"]
    assert limit["would_reject"] <= 0.01 * limit["requests"]
    # ... and one less rejects more than the bound: it is the smallest
    fewer = replayed(tmp_path, log, f"{bounded['count'] - 1}/minute", "fixed_window")
    assert fewer["would_reject"] > 0.01 * fewer["requests"]
    out = json.dumps(data)
    assert '"requests": null' not in out


@pytest.mark.parametrize("algorithm", ALGORITHMS)
@pytest.mark.parametrize("bound", [0.0, 0.002, 0.05, 0.3])
def test_the_suggestion_keeps_to_its_bound_when_replayed(
    tmp_path: Path, algorithm: str, bound: float
) -> None:
    rows = half_from_one_client(seed=5)
    log = tmp_path / "access.log"
    log.write_text("".join(clf(t, ip) for t, ip in rows))
    data = report(tmp_path, log, "--limit", f"per-ip=100/minute,algorithm={algorithm}",
                  "--reject-share", str(bound))  # fmt: skip
    [s] = data["limits"][0]["rates"][0]["suggestions"]
    bounded = s["requests"]
    assert bounded["count"] is not None
    limit = replayed(tmp_path, log, bounded["rate"], algorithm)
    assert limit["would_reject"] == bounded["rejected_requests"]
    assert limit["would_reject"] <= math.floor(bound * limit["requests"] + 1e-9)
    assert limit["keys_rejected"] == bounded["limited_keys"]
    if bounded["count"] > 1:
        fewer = replayed(tmp_path, log, f"{bounded['count'] - 1}/minute", algorithm)
        assert fewer["would_reject"] > bound * fewer["requests"]
    if bound == 0:  # nothing rejected: the largest need
        assert bounded["count"] == s["peak"]["max"] and bounded["rejected_requests"] == 0


@pytest.mark.parametrize("algorithm", ALGORITHMS)
@settings(max_examples=25, deadline=None)
@given(
    events=st.lists(
        st.tuples(st.integers(0, 3), st.integers(0, 40_000), st.sampled_from([1, 1, 2])),
        min_size=1,
        max_size=80,
    ),
    bound=st.sampled_from([0.0, 0.05, 0.2, 0.5]),
)
def test_the_bisection_finds_the_smallest_count(
    algorithm: str, events: list[tuple[int, int, int]], bound: float
) -> None:
    """Against every count from 1 up: the first whose replay keeps to the bound."""
    demand = Demand(10_000)
    for key, t, cost in sorted(events, key=lambda e: e[1]):
        demand.add(f"k{key}", START * 1000 + t, cost)
    try:
        needs = demand.needs(algorithm)
        total = len(events)
        got = within_requests(demand, needs, algorithm, 10.0, bound, None, total)
        allowed = math.floor(bound * total + 1e-9)
        every = range(1, int(max(needs)) + 1)
        smallest = next(
            n
            for n in every
            if sum(demand.rejected_at(algorithm, n, list(range(len(needs)))).values()) <= allowed
        )
        assert got.count == smallest
    finally:
        demand.close()


def test_checks_with_refunds_keep_to_the_bound(tmp_path: Path) -> None:
    """Through the middleware's gate (304s refunded): replaying the checks at the suggested
    rate rejects what the suggestion said."""
    rng = random.Random(9)
    rows = [(t, ip, 304 if rng.random() < 0.5 else 200) for t, ip in half_from_one_client(9)]
    log = tmp_path / "access.log"
    log.write_text("".join(clf(t, ip, status) for t, ip, status in rows))
    (tmp_path / "boundchecks.py").write_text(
        "from ratekeeper.middleware import RateCheck, keys\n"
        "checks = [RateCheck('feed', '1000/hour', key=keys.client_ip())]\n"
    )
    import sys

    sys.path.insert(0, str(tmp_path))
    try:
        data = report(tmp_path, log, "--checks", "boundchecks:checks", "--reject-share", "0.02")
        bounded = data["limits"][0]["rates"][0]["suggestions"][0]["requests"]
        (tmp_path / "boundchecks.py").write_text(
            "from ratekeeper.middleware import RateCheck, keys\n"
            f"checks = [RateCheck('feed', '{bounded['rate']}', key=keys.client_ip())]\n"
        )
        sys.modules.pop("boundchecks", None)
        again = report(tmp_path, log, "--checks", "boundchecks:checks", "--no-suggest")
        [limit] = again["limits"]
        assert limit["would_reject"] == bounded["rejected_requests"] > 0
        assert limit["would_reject"] <= 0.02 * limit["requests"]
    finally:
        sys.path.remove(str(tmp_path))
        sys.modules.pop("boundchecks", None)


def test_not_asked_no_bounded_suggestion_and_a_bad_share_is_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    log = tmp_path / "access.log"
    log.write_text("".join(clf(t, ip) for t, ip in half_from_one_client()[:500]))
    data = report(tmp_path, log, "--limit", "per-ip=100/minute")
    assert data["reject_share"] is None
    assert data["limits"][0]["rates"][0]["suggestions"][0]["requests"] is None
    capsys.readouterr()
    for bad in ("1.5", "-0.1", "1"):
        assert main(["simulate", str(log), "--limit", "a=1/minute", "--reject-share", bad]) == 2
        assert f"--reject-share {float(bad)!r} is invalid" in capsys.readouterr().err
