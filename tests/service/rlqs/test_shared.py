"""Two ``ratekeeper serve`` processes on one Redis serve one fleet: each assigns its own
streams from the shared records, the assigned rates never add up to more than the limit,
a share moves between processes at the streams' next reports, and an Envoy whose service
stopped takes its reservation over on the other one (protocol client, real Redis)."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.service.proc import ServiceProcess
from tests.service.rlqs.client import QuotaClient, kind, rate

BUCKET = {"name": "tenant", "tenant": "acme"}
REPORTS_APART = 1.05
"""A stream's reports of one bucket come 5 s apart from Envoy; a second is the least the
service steps on (``hub.MIN_STEP_MS``)."""


@pytest.fixture
def services(tmp_path: Path, redis_url: str) -> Iterator[list[ServiceProcess]]:
    import redis

    redis.Redis.from_url(redis_url).flushall()
    (tmp_path / "rk.yaml").write_text(f"""\
store: {redis_url}
policies:
  tenant.quota: {{rate: 60/second}}
rlqs:
  buckets:
    - domain: edge
      bucket: {{name: tenant, tenant: "*"}}
      policy: tenant.quota
""")
    made = [ServiceProcess(tmp_path / "rk.yaml") for _ in range(2)]
    yield made
    for s in made:
        assert "Traceback" not in s.stop()


def given(action: object) -> float:
    return 0.0 if kind(action) == "DENY_ALL" else rate(action)


def test_two_processes_share_one_limit(services: list[ServiceProcess]) -> None:
    one, two = services
    assert one.grpc_port is not None and two.grpc_port is not None
    a, b = QuotaClient(one.grpc_port), QuotaClient(two.grpc_port)
    try:
        a.send("edge", (BUCKET, 0, 1, 0))
        assert given(a.next().bucket_action[0]) == 60
        b.send("edge", (BUCKET, 0, 1, 0))
        assert given(b.next().bucket_action[0]) == 0  # a, on the other process, holds it all
        assert a.quiet(1.0)  # the other process cannot push to a: its next report does it
        a.send("edge", (BUCKET, 5, 300, 200))  # (a stream's reports come 5 s apart; 1 s here)
        assert given(a.next().bucket_action[0]) == 30
        time.sleep(REPORTS_APART)
        b.send("edge", (BUCKET, 5, 0, 500))
        assert given(b.next().bucket_action[0]) == 30
    finally:
        a.close()
        b.close()


def test_an_envoy_moving_to_the_other_process_takes_its_reservation_over(
    services: list[ServiceProcess],
) -> None:
    one, two = services
    assert one.grpc_port is not None and two.grpc_port is not None
    a, b = QuotaClient(one.grpc_port), QuotaClient(two.grpc_port)
    try:
        a.send("edge", (BUCKET, 0, 1, 0))
        a.next()
        b.send("edge", (BUCKET, 0, 1, 0))
        b.next()
        time.sleep(REPORTS_APART)
        a.send("edge", (BUCKET, 5, 150, 150))
        assert given(a.next().bucket_action[0]) == 30
        b.send("edge", (BUCKET, 5, 150, 150))
        assert given(b.next().bucket_action[0]) == 30
        one.stop()  # a's record stays, an orphan, reserved for its Envoy
        assert a.done.wait(10)
        moved = QuotaClient(two.grpc_port)  # a's Envoy reconnects: its first report has usage
        moved.send("edge", (BUCKET, 5, 150, 150))
        assert given(moved.next().bucket_action[0]) == 30  # a's reservation, taken over
        stranger = QuotaClient(two.grpc_port)  # a new Envoy gets only what is free
        stranger.send("edge", (BUCKET, 0, 1, 0))
        assert given(stranger.next().bucket_action[0]) == 20  # b and moved give back at once
        assert given(moved.next(2).bucket_action[0]) == given(b.next(2).bucket_action[0]) == 20
        stranger.close()
        moved.close()
    finally:
        a.close()
        b.close()
