"""Support's tools: reset, credit, debit, overrides and plan changes, each audited, each atomic
with the traffic in flight, on every store."""

from __future__ import annotations

import asyncio
import json
import threading
from pathlib import Path
from typing import Any

import pytest

from ratekeeper import AsyncLimiter, ConfigError, Limiter, ManualClock, MemoryStore, Rate
from ratekeeper.quotas import (
    Admin,
    AsyncAdmin,
    FileAudit,
    MemoryAudit,
    Plans,
    Quotas,
)
from tests.conftest import Backend

PLANS = Plans.from_yaml("""\
default: free
plans:
  free:
    api: 5/hour
    exports: {rate: 10/calendar-month, status: 403}
  pro:
    api: 50/hour
    exports: {rate: 1000/calendar-month, timezone: Europe/Berlin, anchor: "15"}
customers:
  acme: pro
""")


def make(store: Any, audit: Any = None) -> tuple[Limiter, Admin, MemoryAudit, ManualClock]:
    memory = MemoryAudit()
    clock = ManualClock(1_710_000_000.0)
    quotas = Quotas(PLANS, audit=audit or memory)
    limiter = Limiter(store, clock=clock, fail_open=False, quotas=quotas)
    return limiter, Admin(limiter), memory, clock


def test_reset_credit_and_debit_on_every_store(backend: Backend) -> None:
    limiter, admin, audit, clock = make(backend.store)
    assert limiter.hit("bob", "plan:api", cost=5).allowed
    assert not limiter.hit("bob", "plan:api").allowed
    top_up = admin.credit("bob", "api", 3, by="alice", reason="ticket 42")
    assert [(r.used, r.remaining) for r in top_up.before] == [(5, 0)]
    assert [(r.used, r.remaining) for r in top_up.after] == [(2, 3)]
    assert [limiter.hit("bob", "plan:api").allowed for _ in range(4)] == [True] * 3 + [False]
    # a credit past what was used: the window holds more than its limit (a top-up)
    more = admin.credit("bob", "api", 10, by="alice")
    assert [(r.used, r.remaining) for r in more.after] == [(-5, 10)]
    charge = admin.debit("bob", "api", 12, by="alice")
    assert [(r.used, r.remaining) for r in charge.after] == [(5, 0)]
    wiped = admin.reset("bob", "api", by="alice")
    assert [(r.used, r.remaining) for r in wiped.after] == [(0, 5)]
    assert [e.action for e in audit.entries] == ["credit", "credit", "debit", "reset"]
    entry = audit.entries[0]
    assert (entry.by, entry.key, entry.limit, entry.units, entry.reason) == (
        "alice", "bob", "api", 3, "ticket 42",
    )  # fmt: skip
    assert entry.before == {"5/1h": {"used": 5, "remaining": 0, "reset_at": 1_710_003_600.0}}
    assert entry.after["5/1h"]["used"] == 2 and entry.at == clock()


def test_the_monthly_quota_of_a_plan_and_a_plain_rate(backend: Backend) -> None:
    limiter, admin, _, _ = make(backend.store)
    assert limiter.hit("acme", "plan:exports", cost=1000).allowed
    adj = admin.credit("acme", "plan:exports", 500, by="billing", reason="bought 500 more")
    (row,) = adj.after
    assert (row.limit, row.remaining, row.plan, row.source) == (1000, 500, "pro", "plan")
    assert row.reset_at == 1_710_457_200.0  # 2024-03-15 00:00 Berlin: the billing anchor
    # a key outside the plans: a rate and its options
    limiter.hit("ip:1", "10/minute", algorithm="gcra")
    adj = admin.debit("ip:1", "10/minute", 4, by="ops", algorithm="gcra")
    assert (adj.before[0].remaining, adj.after[0].remaining) == (9, 5)
    assert adj.after[0].source == "rate"


def test_admin_input_is_checked() -> None:
    _limiter, admin, audit, clock = make(MemoryStore())
    with pytest.raises(ConfigError, match="say who makes the change"):
        admin.reset("bob", "api", by="")
    with pytest.raises(ConfigError, match="units"):
        admin.credit("bob", "api", 10**13, by="a")  # overflows what a count may hold
    with pytest.raises(ConfigError, match="units"):
        admin.credit("bob", "api", 0, by="a")
    with pytest.raises(ConfigError, match="units"):
        admin.debit("bob", "api", -3, by="a")
    with pytest.raises(ConfigError, match="units"):
        admin.debit("bob", "api", True, by="a")  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match="not in the future"):
        admin.override("bob", "api", "100/hour", until=clock() - 1, by="a")
    with pytest.raises(ConfigError, match="not in the future"):
        admin.override("bob", "api", "100/hour", until=clock(), by="a")
    with pytest.raises(ConfigError, match="limit 'nope' is unknown"):
        admin.override("bob", "nope", "100/hour", by="a")
    with pytest.raises(ConfigError, match="calendar periods"):
        Admin(
            Limiter(
                quotas=Quotas(
                    Plans.from_dict(
                        {
                            "default": "f",
                            "plans": {"f": {"x": {"rate": "1/s", "algorithm": "gcra"}}},
                        }
                    )
                )
            )
        ).override("bob", "x", "5/calendar-day", by="a")
    with pytest.raises(ValueError, match="'-5'"):
        admin.override("bob", "api", "-5/hour", by="a")
    with pytest.raises(ConfigError, match="plan 'gold' is unknown"):
        admin.set_plan("bob", "gold", by="a")
    with pytest.raises(ConfigError, match="names no limit"):
        admin.reset("bob", "plan:nope", by="a")
    assert audit.entries == type(audit.entries)()  # nothing refused was recorded


def test_overrides_and_plan_changes_keep_the_counts_and_are_audited(tmp_path: Path) -> None:
    path = tmp_path / "audit.jsonl"
    limiter, admin, _, clock = make(MemoryStore(), audit=FileAudit(path))
    assert limiter.hit("bob", "plan:api", cost=5).allowed
    admin.override("bob", "api", "20/hour", until=clock() + 86_400, by="alice", reason="trial")
    d = limiter.hit("bob", "plan:api")
    assert d.allowed and d.limit == 20 and d.remaining == 14  # 5 used are still used
    admin.clear_override("bob", "api", by="alice")
    assert not limiter.hit("bob", "plan:api").allowed  # 6 of 5
    admin.set_plan("bob", "pro", by="sales")
    assert limiter.hit("bob", "plan:api").remaining == 43
    admin.set_plan("bob", None, by="sales")
    assert not limiter.hit("bob", "plan:api").allowed
    entries = [json.loads(line) for line in path.read_text().splitlines()]
    assert [e["action"] for e in entries] == ["override", "clear-override", "plan", "plan"]
    assert entries[0]["after"]["rate"] == "20/hour" and entries[0]["after"]["by"] == "alice"
    assert entries[1]["before"]["rate"] == "20/hour" and entries[1]["after"] == {}
    assert entries[2]["before"] == {"plan": "free"} and entries[2]["after"] == {"plan": "pro"}


def test_a_failing_audit_sink_is_logged_and_the_change_stands(
    caplog: pytest.LogCaptureFixture,
) -> None:
    class Broken:
        def write(self, entry: Any) -> None:
            raise OSError("disk full")

    limiter, admin, _, _ = make(MemoryStore(), audit=Broken())
    limiter.hit("bob", "plan:api", cost=5)
    adj = admin.credit("bob", "api", 2, by="alice")
    assert adj.after[0].remaining == 2
    assert "disk full" in caplog.text and '"action":"credit"' in caplog.text


def test_the_async_admin_does_the_same() -> None:
    clock = ManualClock(1_710_000_000.0)
    audit = MemoryAudit()
    quotas = Quotas(PLANS, audit=audit)
    limiter = AsyncLimiter(MemoryStore(), clock=clock, quotas=quotas)
    admin = AsyncAdmin(limiter)

    async def run() -> None:
        assert (await limiter.hit("bob", "plan:api", cost=5)).allowed
        adj = await admin.credit("bob", "api", 2, by="a")
        assert adj.after[0].remaining == 2
        await admin.override("bob", "api", "9/hour", until=clock() + 60, by="a")
        assert (await limiter.hit("bob", "plan:api")).limit == 9
        await admin.set_plan("bob", "pro", by="a")
        await admin.clear_override("bob", "api", by="a")
        assert (await limiter.hit("bob", "plan:api")).limit == 50
        assert len(await limiter.status("bob")) == 2

    asyncio.run(run())
    assert [e.action for e in audit.entries] == ["credit", "override", "plan", "clear-override"]


def _hammer(limiter: Limiter, key: str, rate: str, attempts: int, admitted: list[int]) -> None:
    ok = 0
    for _ in range(attempts):
        ok += limiter.hit(key, rate).allowed
    admitted.append(ok)


def test_credit_debit_and_reset_lose_nothing_under_concurrent_hits(backend: Backend) -> None:
    """Four threads hit one key while an admin credits, debits and resets it. Every change is
    one atomic step, so the count is conserved: what was admitted, plus the debits, minus the
    credits and minus what each reset found, is exactly the count left."""
    store = backend.store
    clock = ManualClock(1_710_000_000.0)
    limiter = Limiter(store, clock=clock, fail_open=False)
    admin = Admin(limiter, audit=MemoryAudit())
    rate = Rate(100_000, 3600.0)  # never reached: every hit is admitted, every count exact
    admitted: list[int] = []
    threads = [
        threading.Thread(target=_hammer, args=(limiter, "k", rate.code, 300, admitted))
        for _ in range(4)
    ]
    for t in threads:
        t.start()
    changes = []
    for i in range(30):
        op = ("credit", "debit", "reset")[i % 3]
        if op == "reset":
            changes.append(admin.reset("k", rate.code, by="t"))
        else:
            changes.append(getattr(admin, op)("k", rate.code, 7 + i, by="t"))
    for t in threads:
        t.join()
    final = limiter.peek("k", rate.code, cost=0)
    count = rate.count - final.remaining
    net = sum(
        -c.units if c.action == "credit" else c.units if c.action == "debit" else 0 for c in changes
    )
    removed = sum(c.before[0].used for c in changes if c.action == "reset")
    assert sum(admitted) + net - removed == count
    for c in changes:  # each change moved the count by exactly its units, in one step
        moved = c.after[0].used - c.before[0].used
        want = {"credit": -c.units, "debit": c.units, "reset": -c.before[0].used}[c.action]
        assert moved == want


def test_a_credit_under_contention_admits_exactly_its_units(backend: Backend) -> None:
    """A key at its limit with threads knocking: each credit of n lets exactly n more in."""
    store = backend.store
    limiter = Limiter(store, clock=ManualClock(1_710_000_000.0), fail_open=False)
    admin = Admin(limiter, audit=MemoryAudit())
    admitted: list[int] = []
    assert limiter.hit("k", "20/hour", cost=20).allowed
    done = threading.Event()

    def knock() -> None:
        ok = 0
        while not done.is_set():
            ok += limiter.hit("k", "20/hour").allowed
        admitted.append(ok)

    threads = [threading.Thread(target=knock) for _ in range(4)]
    for t in threads:
        t.start()
    for units in (3, 5, 7):
        admin.credit("k", "20/hour", units, by="t")
    while limiter.peek("k", "20/hour", cost=0).remaining > 0:
        pass
    done.set()
    for t in threads:
        t.join()
    assert sum(admitted) == 3 + 5 + 7


STACKED = Plans.from_yaml("""\
default: free
plans:
  free:
    api: {rate: 2/second; 100/hour, algorithm: sliding_window}
    burst: {rate: 10/minute, algorithm: token_bucket}
    exports: 10/calendar-month
""")


def test_status_lists_every_limit_and_charges_nothing(backend: Backend) -> None:
    clock = ManualClock(1_710_000_000.0)
    limiter = Limiter(backend.store, clock=clock, fail_open=False, quotas=Quotas(STACKED))
    limiter.hit("bob", "plan:api")
    limiter.hit("bob", "plan:burst", cost=3)

    def rows() -> list[tuple[str, str, int, int]]:
        return [(r.name, r.rate, r.used, r.remaining) for r in limiter.status("bob")]

    expected = [
        ("api", "2/1s", 1, 1),
        ("api", "100/1h", 1, 99),
        ("burst", "10/1m", 3, 7),
        ("exports", "10/calendar-month", 0, 10),
    ]
    assert [rows() for _ in range(5)] == [expected] * 5  # asked five times, charged nothing
    assert limiter.hit("bob", "plan:api").remaining == 0  # the second of this second
    assert rows()[0][2:] == (2, 0)
