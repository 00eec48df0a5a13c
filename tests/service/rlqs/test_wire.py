"""The quota service over gRPC, driven by a client that follows the protocol (``client.py``)
against a real ``ratekeeper serve``: the parts Envoy 1.40 cannot exercise or show (the
exact numbers sent, pushes to several streams, abandon actions on reload, lenient reports,
refusals), and what the wire must never send (a sub-second fill interval, a TTL under the
report period, ``requests_per_time_unit``)."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import grpc
import httpx
import pytest

from tests.service.proc import ServiceProcess, run_serve
from tests.service.rlqs.client import QuotaClient, kind, rate

ADMIN = "admin-token-0123456789"
CLIENT = "client-token-0123456789"
CONFIG = """\
policies:
  tenant.quota: {rate: 90/second}
rlqs:
  assignment_ttl: 15
  buckets:
    - domain: edge
      bucket: {name: tenant, tenant: "*"}
      policy: tenant.quota
    - domain: edge
      bucket: {name: fixed}
      rate: 100/minute
"""
ACME = {"name": "tenant", "tenant": "acme"}
ENV = {"RATEKEEPER_ADMIN_TOKEN": ADMIN, "RATEKEEPER_TOKEN": CLIENT}


@pytest.fixture(scope="module")
def service(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServiceProcess]:
    folder = tmp_path_factory.mktemp("rlqs") / "config"
    folder.mkdir()
    (folder / "rk.yaml").write_text(CONFIG)
    proc = ServiceProcess(folder, env=ENV)
    yield proc
    stderr = proc.stop()
    assert "Traceback" not in stderr, stderr


@pytest.fixture
def clients(service: ServiceProcess) -> Iterator[list[QuotaClient]]:
    made: list[QuotaClient] = []
    yield made
    for c in made:
        c.close()


def connect(service: ServiceProcess, clients: list[QuotaClient], n: int = 1) -> list[QuotaClient]:
    assert service.grpc_port is not None
    new = [QuotaClient(service.grpc_port) for _ in range(n)]
    clients.extend(new)
    return new


def toggle(service: ServiceProcess, **body: bool) -> None:
    r = httpx.post(f"{service.url}/v1/admin/policies/tenant.quota", json=body,
                   headers={"Authorization": f"Bearer {ADMIN}"}, timeout=10)  # fmt: skip
    assert r.status_code == 200, r.text


def test_a_first_report_is_answered_with_a_token_bucket_envoy_can_enforce(
    service: ServiceProcess, clients: list[QuotaClient]
) -> None:
    (c,) = connect(service, clients)
    c.send("edge", ({**ACME, "tenant": "first"}, 0, 1, 0))  # Envoy's first report: elapsed 0
    (action,) = c.next().bucket_action
    assignment = action.quota_assignment_action
    assert dict(action.bucket_id.bucket) == {"name": "tenant", "tenant": "first"}
    assert assignment.assignment_time_to_live.seconds == 15  # whole, above the 5 s reports
    assert assignment.assignment_time_to_live.nanos == 0
    strategy = assignment.rate_limit_strategy
    assert strategy.WhichOneof("strategy") == "token_bucket"  # never requests_per_time_unit
    bucket = strategy.token_bucket
    assert bucket.fill_interval.seconds >= 1 and bucket.fill_interval.nanos == 0
    assert rate(action) == 90 and bucket.max_tokens == 90


def test_a_slow_rate_is_sent_with_a_long_whole_second_interval(
    service: ServiceProcess, clients: list[QuotaClient]
) -> None:
    (c,) = connect(service, clients)
    c.send("edge", ({"name": "fixed"}, 0, 1, 0))
    (action,) = c.next().bucket_action
    bucket = action.quota_assignment_action.rate_limit_strategy.token_bucket
    assert (bucket.fill_interval.seconds, bucket.tokens_per_fill.value) == (900, 1499)


def test_a_second_stream_takes_a_share_and_the_first_is_pushed_its_own(
    service: ServiceProcess, clients: list[QuotaClient]
) -> None:
    a, b, c = connect(service, clients, 3)
    bucket = {**ACME, "tenant": "shared"}
    a.send("edge", (bucket, 0, 1, 0))
    assert rate(a.next().bucket_action[0]) == 90
    b.send("edge", (bucket, 0, 1, 0))
    assert rate(b.next().bucket_action[0]) == 45
    assert rate(a.next(2).bucket_action[0]) == 45  # pushed: a did not report
    c.send("edge", (bucket, 0, 1, 0))
    assert rate(c.next().bucket_action[0]) == 30
    assert rate(a.next(2).bucket_action[0]) == rate(b.next(2).bucket_action[0]) == 30
    c.close()  # an Envoy leaves: its share goes back to the others at once
    assert rate(a.next(2).bucket_action[0]) == rate(b.next(2).bucket_action[0]) == 45


def test_reports_are_read_leniently_as_envoy_sends_them(
    service: ServiceProcess, clients: list[QuotaClient]
) -> None:
    (c,) = connect(service, clients)
    bucket = {**ACME, "tenant": "lenient"}
    c.send("edge", ({}, 0, 1, 0), (bucket, 0, 1, 0))  # a usage without a bucket id: skipped
    (action,) = c.next().bucket_action
    assert dict(action.bucket_id.bucket) == bucket
    c.send("edge", (bucket, 0, 0, 0))  # time_elapsed 0 after the first (rounded down): fine
    assert rate(c.next().bucket_action[0]) == 90
    c.send("nowhere", ({"x": "y"}, 5, 3, 0))  # no rule: no_assignment, nothing sent
    assert c.quiet(1.0)
    metrics = httpx.get(f"{service.url}/metrics", timeout=10).text
    assert 'ratekeeper_rlqs_refused_total{reason="bucket_id"} 1.0' in metrics
    assert 'ratekeeper_rlqs_unmatched_total{domain="nowhere"} 1.0' in metrics


def test_the_block_toggle_reaches_every_stream_within_a_second(
    service: ServiceProcess, clients: list[QuotaClient]
) -> None:
    streams = connect(service, clients, 3)
    for i, c in enumerate(streams):
        c.send("edge", ({**ACME, "tenant": f"kill{i}"}, 0, 1, 0))
        c.next()
    try:
        start = time.monotonic()
        toggle(service, block=True)
        arrivals = [c.next_at(2) for c in streams]
        assert all(kind(r.bucket_action[0]) == "DENY_ALL" for _, r in arrivals)
        for i, (_, r) in enumerate(arrivals):  # each stream is sent only what it reported
            assert [dict(a.bucket_id.bucket)["tenant"] for a in r.bucket_action] == [f"kill{i}"]
        assert max(t for t, _ in arrivals) - start < 1.0
        toggle(service, block=False, shadow=True)
        assert all(kind(c.next(2).bucket_action[0]) == "ALLOW_ALL" for c in streams)
    finally:
        toggle(service, block=False, shadow=False, enabled=True)
    assert all(kind(c.next(2).bucket_action[0]) == "token_bucket" for c in streams)


def test_a_reload_that_drops_the_rule_abandons_the_bucket(
    service: ServiceProcess, clients: list[QuotaClient]
) -> None:
    (c,) = connect(service, clients)
    c.send("edge", ({"name": "fixed"}, 0, 1, 0))
    c.next()
    path = Path(_config_dir(service)) / "rk.yaml"
    rule = "    - domain: edge\n      bucket: {name: fixed}\n      rate: 100/minute\n"
    assert rule in CONFIG
    path.write_text(CONFIG.replace(rule, ""))
    try:
        response = c.next(10)  # the directory is watched: the reload pushes it
        assert [kind(a) for a in response.bucket_action] == ["abandon"]
    finally:
        path.write_text(CONFIG)
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and "fixed" not in _rules(service):
            time.sleep(0.1)


def _config_dir(service: ServiceProcess) -> str:
    args = service.proc.args
    assert isinstance(args, list)
    return str(args[args.index("--config") + 1])


def _rules(service: ServiceProcess) -> str:
    return httpx.get(f"{service.url}/v1/policies", timeout=10,
                     headers={"Authorization": f"Bearer {CLIENT}"}).text  # fmt: skip


def test_bytes_that_are_not_a_report_end_the_stream(
    service: ServiceProcess, clients: list[QuotaClient]
) -> None:
    (c,) = connect(service, clients)
    c.send_raw(b"\xff\xff\xff")
    assert c.done.wait(10)
    assert c.error is not None and c.error.code() == grpc.StatusCode.INVALID_ARGUMENT


def test_grpc_auth_covers_the_quota_stream(tmp_path: Path) -> None:
    (tmp_path / "rk.yaml").write_text(CONFIG + "auth:\n  grpc: true\n")
    proc = ServiceProcess(tmp_path / "rk.yaml", env=ENV)
    try:
        assert proc.grpc_port is not None
        bare = QuotaClient(proc.grpc_port)
        bare.send("edge", (ACME, 0, 1, 0))
        assert bare.done.wait(10) and bare.error is not None
        assert bare.error.code() == grpc.StatusCode.UNAUTHENTICATED
        bare.close()
        good = QuotaClient(proc.grpc_port, (("authorization", f"Bearer {CLIENT}"),))
        good.send("edge", (ACME, 0, 1, 0))
        assert rate(good.next().bucket_action[0]) == 90
        good.close()
    finally:
        proc.stop()


def test_grpc_threads_with_quota_rules_is_refused(tmp_path: Path) -> None:
    (tmp_path / "rk.yaml").write_text(CONFIG)
    done = run_serve("--config", str(tmp_path / "rk.yaml"), "--port", "0", "--grpc-port", "0",
                     "--grpc-threads", "2")  # fmt: skip
    assert done.returncode == 2 and "--grpc-threads" in done.stderr and "rlqs" in done.stderr
