"""The quick subset of ./scripts/reliability: every scenario at its short size, asserting its
rows pass. The soak is marked ``slow`` (30 s): it runs with ``RATEKEEPER_SLOW=1`` or from
``./scripts/reliability``.
"""

from __future__ import annotations

import os

import pytest

from tests.conftest import _need_sentinel
from tests.reliability.__main__ import scenarios
from tests.reliability.report import table

SLOW = {"soak"}
CASES = scenarios(quick=True, soak_seconds=30.0)


@pytest.mark.parametrize(
    "name",
    [pytest.param(name, marks=[pytest.mark.slow] if name in SLOW else []) for name, _ in CASES],
)
def test_scenario_passes(name: str, request: pytest.FixtureRequest) -> None:
    if name in SLOW and os.environ.get("RATEKEEPER_SLOW") != "1":
        pytest.skip("slow: set RATEKEEPER_SLOW=1 or run ./scripts/reliability")
    request.getfixturevalue("redis_server")  # skips (or fails under CI) without redis-server
    if name == "sentinel failover":
        _need_sentinel()
    rows = dict(CASES)[name]()
    assert rows, "a scenario reports at least one row"
    assert all(r.passed for r in rows), "\n" + table(rows)
