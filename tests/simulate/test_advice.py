"""Suggestions that answer "what limit": the knee that separates outliers, what each
suggestion would reject (requests, not keys), and refunds in the needs."""

from __future__ import annotations

import json
import math
import random
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from ratekeeper import Limiter, ManualClock, Rate
from ratekeeper.cli import main
from ratekeeper.simulate.advice import knee
from ratekeeper.simulate.suggest import Demand

START = 1_700_000_000
ALGORITHMS = ["fixed_window", "sliding_window", "sliding_log", "token_bucket", "gcra"]


def clf(t: float, ip: str, path: str, status: int = 200, method: str = "POST") -> str:
    when = datetime.fromtimestamp(t, UTC).strftime("%d/%b/%Y:%H:%M:%S +0000")
    return f'{ip} - - [{when}] "{method} {path} HTTP/1.1" {status} 64 "-" "x"\n'


def attack_log(seed: int = 11) -> tuple[str, set[str], set[str]]:
    """An hour on /login: 489 users log in now and then, 300 addresses stuff credentials
    for twenty minutes, each a try every 2 to 6 seconds."""
    rng = random.Random(seed)
    users = {f"10.1.{i // 200}.{i % 200}" for i in range(489)}
    attackers = {f"198.51.{i // 200}.{i % 200}" for i in range(300)}
    lines: list[tuple[float, str]] = []
    for ip in sorted(users):
        for _ in range(rng.randrange(1, 6)):
            t = START + rng.uniform(0, 3600)
            lines.append((t, ip))
            if rng.random() < 0.3:  # a typo, tried again
                lines.append((t + rng.uniform(2, 20), ip))
    for ip in sorted(attackers):
        t = START + 1200 + rng.uniform(0, 60)
        while t < START + 2400:
            lines.append((t, ip))
            t += rng.uniform(2, 6)
    lines.sort()
    text = "".join(clf(t, ip, "/login", 401) for t, ip in lines)
    return text, users, attackers


def report(tmp_path: Path, log: Path, *args: str) -> dict[str, Any]:
    out = tmp_path / "r.json"
    assert main(["simulate", str(log), *args, "--json", str(out), "--no-progress"]) == 0
    data: dict[str, Any] = json.loads(out.read_text())
    return data


def test_the_outliers_suggestion_stops_a_credential_stuffing_attack(tmp_path: Path) -> None:
    text, users, attackers = attack_log()
    log = tmp_path / "login.log"
    log.write_text(text)
    data = report(tmp_path, log, "--limit", "login=100/minute", "--top", "400")
    [limit] = data["limits"]
    assert limit["keys"] == len(users) + len(attackers) == 789
    assert limit["would_reject"] == 0  # the candidate lets the attack through
    [rate] = limit["rates"]
    [s] = rate["suggestions"]
    # touching almost nobody (0.1 % of keys) means letting the attack through too ...
    assert s["limited_keys"] == 0 and s["rejected_requests"] == 0
    # ... but the keys split into two groups, and the second suggestion stops the attackers
    outliers = s["outliers"]
    assert outliers is not None
    low, high = outliers["gap"]
    assert outliers["count"] == low < high
    assert outliers["limited_keys"] == len(attackers)
    assert {k["key"] for k in outliers["stops"]} <= attackers and len(outliers["stops"]) == 10
    assert 0.5 < outliers["rejected_share"] < 0.95
    # replayed at the suggested rate: every attacker stopped, most of the attack rejected,
    # no user ever rejected
    again = report(tmp_path, log, "--limit", f"login={outliers['rate']}", "--top", "400")
    [limit] = again["limits"]
    rejected = {t["key"] for t in limit["top_keys"]}
    assert rejected == attackers
    attack = sum(1 for line in text.splitlines() if line.startswith("198.51."))
    assert limit["would_reject"] == outliers["rejected_requests"]
    assert limit["would_reject"] > 0.7 * attack


def test_scrapers_few_keys_many_requests(tmp_path: Path) -> None:
    """46 scrapers among 4,600 addresses: 1 % of the keys, about half of the requests. The
    suggestion that limits 1 % of the keys says it rejects a third of all requests."""
    rng = random.Random(3)
    rows = []
    for i in range(4554):
        for _ in range(rng.randrange(1, 4)):
            rows.append((START + rng.uniform(0, 600), f"10.2.{i // 250}.{i % 250}"))
    for i in range(46):
        t = START + rng.uniform(0, 5)
        while t < START + 600:
            rows.append((t, f"192.0.2.{i}"))
            t += rng.uniform(1.5, 3.5)
    rows.sort()
    log = tmp_path / "access.log"
    log.write_text("".join(clf(t, ip, "/", 200, "GET") for t, ip in rows))
    data = report(tmp_path, log, "--limit", "per-ip=1000/minute", "--share", "0.01")
    [s] = data["limits"][0]["rates"][0]["suggestions"]
    scraped = sum(1 for _, ip in rows if ip.startswith("192.0.2."))
    assert 0.4 < scraped / len(rows) < 0.6
    assert s["limited_keys"] == 46 and {k["key"][:8] for k in s["stops"]} == {"192.0.2."}
    assert s["rejected_share"] > 0.25  # requests, not keys
    assert s["stops"][0]["traffic_share"] == pytest.approx(
        max(sum(1 for _, ip in rows if ip == k["key"]) for k in s["stops"]) / len(rows)
    )


@pytest.mark.parametrize("algorithm", ALGORITHMS)
def test_what_a_suggestion_says_it_rejects_is_what_it_rejects(
    tmp_path: Path, algorithm: str
) -> None:
    """``rejected_requests`` of each suggestion is what a replay at its rate rejects."""
    text, _, _ = attack_log(seed=5)
    log = tmp_path / "login.log"
    log.write_text(text)
    data = report(tmp_path, log, "--limit", f"login=100/minute,algorithm={algorithm}")
    [s] = data["limits"][0]["rates"][0]["suggestions"]
    for suggestion in (s, s["outliers"]):
        if suggestion is None or suggestion["count"] is None:
            continue
        again = report(
            tmp_path, log, "--limit", f"x={suggestion['rate']},algorithm={algorithm}",
            "--no-suggest",
        )  # fmt: skip
        [limit] = again["limits"]
        assert limit["would_reject"] == suggestion["rejected_requests"], suggestion["rate"]
        assert limit["keys_rejected"] == suggestion["limited_keys"]


@pytest.mark.parametrize(
    ("needs", "expected"),
    [
        ([1.0] * 600 + [3.0] * 300 + [5.0] * 89, None),  # small whole counts: no gap
        ([float(1 + i % 40) for i in range(1000)], None),  # even spread
        ([float(x) for x in range(1, 11)] * 50 + [25.0, 30.0] * 150, (10.0, 25.0)),  # attack
        ([float(1 + i % 60) for i in range(4554)] + [200.0 + i for i in range(46)], (60.0, 200.0)),
        ([2.0] * 40 + [50.0] * 60, None),  # the heavy ones are most keys: not outliers
        ([3.0] * 99 + [math.inf], (3.0, math.inf)),
        ([], None),
        ([7.0], None),
    ],
)
def test_the_knee(needs: list[float], expected: tuple[float, float] | None) -> None:
    assert knee(needs) == expected


def brute_needs_with_refunds(
    events: list[tuple[str, int, int, bool]], period: float, algo: str
) -> dict[str, float]:
    """Each key's need with ``Limiter``: the smallest count under which no hit is rejected,
    refunded hits given back as the middleware gives back a 304's."""
    keys = {k for k, *_ in events}
    brute: dict[str, float] = {}
    for n in range(1, sum(c for _, _, c, _ in events) + 1):
        clock = ManualClock()
        limiter = Limiter(clock=clock)
        rate = (Rate(n, period),)
        limited = set()
        for key, t, cost, refunded in events:
            clock.set(t / 1000)
            if not limiter.hit(key, rate, algorithm=algo, cost=cost).allowed:
                limited.add(key)
            elif refunded:
                limiter.refund(key, rate, algorithm=algo, cost=cost)
        for k in keys - limited - brute.keys():
            brute[k] = float(n)
        if len(brute) == len(keys):
            break
    return brute


@pytest.mark.parametrize("algorithm", ALGORITHMS)
@pytest.mark.parametrize("seed", range(3))
def test_needs_with_refunds_match_brute_force(algorithm: str, seed: int) -> None:
    rng = random.Random(seed)
    t = START * 1000
    events = []
    for _ in range(rng.randrange(40, 120)):
        t += rng.choice((0, 5, 50, 300, 900, 2500))
        events.append((f"k{rng.randrange(4)}", t, rng.choice((1, 1, 2)), rng.random() < 0.4))
    demand = Demand(10_000)
    for key, when, cost, refunded in events:
        demand.add(key, when, cost, refunded)
    needs = demand.needs(algorithm)
    got = {k: needs[i] for k, i in demand.ids.items()}
    assert got == brute_needs_with_refunds(events, 10.0, algorithm)
    demand.close()


def test_304s_refunded_by_the_middleware_lower_the_suggestion(tmp_path: Path) -> None:
    """A client revalidating its cache: most of its requests are 304s, which the middleware
    refunds. Its need counts only what stays charged, and replaying the checks at the
    suggested rate rejects nothing (one less rejects)."""
    rng = random.Random(8)
    rows = []
    for i in range(40):
        ip = f"10.3.0.{i}"
        for _ in range(rng.randrange(5, 40)):
            rows.append((START + rng.uniform(0, 3600), ip, 304 if rng.random() < 0.7 else 200))
    rows.sort()
    log = tmp_path / "access.log"
    log.write_text("".join(clf(t, ip, "/feed", status, "GET") for t, ip, status in rows))
    (tmp_path / "refundchecks.py").write_text(
        "from ratekeeper.middleware import RateCheck, keys\n"
        "checks = [RateCheck('feed', '1000/hour', key=keys.client_ip())]\n"
    )
    import sys

    sys.path.insert(0, str(tmp_path))
    try:
        data = report(tmp_path, log, "--checks", "refundchecks:checks", "--share", "0")
        [s] = data["limits"][0]["rates"][0]["suggestions"]
        count = s["count"]
        charged = max(sum(1 for _, ip2, st in rows if ip2 == ip and st != 304) for _, ip, _ in rows)
        every = max(sum(1 for _, ip2, _ in rows if ip2 == ip) for _, ip, _ in rows)
        assert charged <= count <= charged + 1 < every  # a 304 must fit, then is given back
        for n, rejects in ((count, False), (count - 1, True)):
            (tmp_path / "refundchecks.py").write_text(
                "from ratekeeper.middleware import RateCheck, keys\n"
                f"checks = [RateCheck('feed', '{n}/hour', key=keys.client_ip())]\n"
            )
            sys.modules.pop("refundchecks", None)
            again = report(tmp_path, log, "--checks", "refundchecks:checks", "--no-suggest")
            assert (again["limits"][0]["would_reject"] > 0) is rejects
    finally:
        sys.path.remove(str(tmp_path))
        sys.modules.pop("refundchecks", None)
