"""``ratekeeper serve`` as a real process on free ports: HTTP via httpx, gRPC via Envoy's
generated stub (xds-protos), auth, bad input, reloads and metrics."""

from __future__ import annotations

import base64
import json
import signal
import socket
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import httpx
import jsonschema
import pytest
from envoy.extensions.common.ratelimit.v3 import ratelimit_pb2 as common_pb
from envoy.service.ratelimit.v3 import rls_pb2 as pb
from envoy.service.ratelimit.v3 import rls_pb2_grpc as pb_grpc

from tests.service.proc import ServiceProcess, run_serve

TOKEN = "client-token-0123456789"
ADMIN = "admin-token-0123456789"

CONFIG = f"""\
auth:
  token: {TOKEN}
  admin_token: {ADMIN}
limits:
  max_key_length: 32
policies:
  three:
    rate: 3/hour
  stacked:
    rate: 2/hour; 10/day
  shadowed:
    rate: 1/hour
    shadow: true
  slots:
    kind: concurrency
    capacity: 2
    lease_ttl: 30
  single:
    kind: concurrency
    capacity: 1
  slots.shadow:
    kind: concurrency
    capacity: 1
    shadow: true
domains:
  - domain: edge
    descriptors:
      - key: ip
        rate_limit: {{unit: hour, requests_per_unit: 2, name: per-ip}}
      - key: plan
        value: internal
        rate_limit: {{unlimited: true}}
"""

USER = {"Authorization": f"Bearer {TOKEN}"}
ADMIN_H = {"Authorization": f"Bearer {ADMIN}"}


@pytest.fixture(scope="module")
def config_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("svc") / "ratekeeper.yaml"
    path.write_text(CONFIG)
    return path


@pytest.fixture(scope="module")
def service(config_file: Path) -> Iterator[ServiceProcess]:
    proc = ServiceProcess(config_file)
    yield proc
    proc.stop()


@pytest.fixture
def http(service: ServiceProcess) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=service.url, headers=USER, timeout=10) as client:
        yield client


def test_hit_peek_refund_reset(http: httpx.Client) -> None:
    body = {"policy": "three", "key": "hit-user"}
    answers = [http.post("/v1/hit", json=body) for _ in range(4)]
    assert [r.status_code for r in answers] == [200] * 4
    assert [r.json()["allowed"] for r in answers] == [True, True, True, False]
    first, last = answers[0].json(), answers[-1].json()
    assert first["limit"] == 3 and first["remaining"] == 2 and first["policy"] == "three"
    assert first["retry_after"] == 0 and first["reset_at"] > time.time()
    assert last["remaining"] == 0 and 0 < last["retry_after"] <= 3600
    assert answers[0].headers["X-RateLimit-Remaining"] == "2"
    assert answers[-1].headers["Retry-After"] == str(int(-(-last["retry_after"] // 1)))
    assert http.post("/v1/peek", json=body).json()["allowed"] is False
    assert http.post("/v1/refund", json={**body, "cost": 2}).json()["refunded"] == 2
    peek = http.post("/v1/peek", json={**body, "cost": 2}).json()
    assert peek["allowed"] and peek["remaining"] == 2
    assert http.post("/v1/reset", json=body).status_code == 403  # reset is an admin route
    assert http.post("/v1/reset", json=body, headers=ADMIN_H).json()["reset"] is True
    assert http.post("/v1/hit", json={**body, "cost": 3}).json()["remaining"] == 0


def test_stacked_and_shadow(http: httpx.Client) -> None:
    stacked = [
        http.post("/v1/hit", json={"policy": "stacked", "key": "s"}).json() for _ in range(3)
    ]
    assert [s["allowed"] for s in stacked] == [True, True, False]
    shadow = [
        http.post("/v1/hit", json={"policy": "shadowed", "key": "s"}).json() for _ in range(2)
    ]
    assert [s["allowed"] for s in shadow] == [True, True]
    assert [s["shadow"] for s in shadow] == [False, True]


def test_auth(service: ServiceProcess, http: httpx.Client) -> None:
    body = {"policy": "three", "key": "auth-user"}
    with httpx.Client(base_url=service.url, timeout=10) as anon:
        assert anon.post("/v1/hit", json=body).status_code == 401
        wrong = anon.post("/v1/hit", json=body, headers={"Authorization": f"Bearer {TOKEN}x"})
        assert wrong.status_code == 401 and wrong.json()["field"] == "authorization"
        basic = anon.post("/v1/hit", json=body, headers={"Authorization": f"Basic {TOKEN}"})
        assert basic.status_code == 401
        assert anon.get("/v1/policies").status_code == 401
        assert anon.get("/healthz").status_code == 200  # health and metrics are open
        assert anon.get("/metrics").status_code == 200
        assert anon.post("/v1/hit", json=body, headers=ADMIN_H).status_code == 200
        assert anon.post("/v1/admin/reload").status_code == 401
        assert anon.post("/v1/admin/reload", headers=USER).status_code == 403
    assert http.post("/v1/peek", json=body).json()["remaining"] == 2  # only the admin's hit


BAD_INPUT = [
    (b"{not json", "body", 400),
    (b"[1, 2]", "body", 400),
    (b"", "body", 400),
    (b'{"policy": "three", "key": "bad", "cost": NaN}', "body", 400),
    (b'{"policy": "nope", "key": "bad"}', "policy", 404),
    (b'{"policy": 7, "key": "bad"}', "policy", 400),
    (b'{"key": "bad"}', "policy", 400),
    (b'{"policy": "three"}', "key", 400),
    (b'{"policy": "three", "key": ""}', "key", 400),
    (b'{"policy": "three", "key": ["bad"]}', "key", 400),
    (b'{"policy": "three", "key": "' + b"k" * 33 + b'"}', "key", 400),
    (b'{"policy": "three", "key": "\\ud800"}', "key", 400),
    (b'{"policy": "three", "key": "bad", "cost": "2"}', "cost", 400),
    (b'{"policy": "three", "key": "bad", "cost": 0}', "cost", 400),
    (b'{"policy": "three", "key": "bad", "cost": 1.5}', "cost", 400),
    (b'{"policy": "three", "key": "bad", "cost": true}', "cost", 400),
    (b'{"policy": "three", "key": "bad", "extra": 1}', "body", 400),  # names 'extra'
    (b'{"policy": "three", "key": "bad", "pad": "' + b"x" * 70_000 + b'"}', "body", 413),
]


@pytest.mark.parametrize(("raw", "field", "status"), BAD_INPUT)
def test_bad_input_is_4xx_naming_the_field_and_counts_nothing(
    http: httpx.Client, raw: bytes, field: str, status: int
) -> None:
    before = http.post("/v1/peek", json={"policy": "three", "key": "bad"}).json()["remaining"]
    for path in ("/v1/hit", "/v1/refund"):
        r = http.post(path, content=raw, headers={"content-type": "application/json"})
        assert r.status_code == status, r.text
        assert r.json()["field"] == field and r.json()["error"]
    after = http.post("/v1/peek", json={"policy": "three", "key": "bad"}).json()["remaining"]
    assert before == after == 3


def test_routes_and_methods(http: httpx.Client) -> None:
    assert http.get("/v1/hit").status_code == 405
    assert http.get("/v1/nothing").status_code == 404
    assert http.get("/nothing").json()["field"] == "path"
    names = {p["name"] for p in http.get("/v1/policies").json()["policies"]}
    assert {"three", "stacked", "shadowed", "edge/ip"} <= names
    spec = http.get("/openapi.json").json()
    assert spec["openapi"].startswith("3.") and "/v1/hit" in spec["paths"]
    # the document states this config's key limit: a request valid by it is accepted
    schemas = spec["components"]["schemas"]
    for name in ("HitRequest", "ResetRequest", "AcquireRequest"):
        assert schemas[name]["properties"]["key"]["maxLength"] == 32, name
    assert http.post("/v1/hit", json={"policy": "three", "key": "k" * 32}).status_code == 200
    assert http.post("/v1/hit", json={"policy": "three", "key": "k" * 33}).status_code == 400


def test_answers_match_the_openapi_document(http: httpx.Client) -> None:
    doc = http.get("/openapi.json").json()

    def check(value: object, name: str) -> None:
        schema = {"$ref": f"#/components/schemas/{name}", "components": doc["components"]}
        jsonschema.validate(value, schema)

    hit = http.post("/v1/hit", json={"policy": "stacked", "key": "openapi"}).json()
    check(hit, "Decision")
    for _ in range(3):
        over = http.post("/v1/hit", json={"policy": "stacked", "key": "openapi"}).json()
    check(over, "Decision")
    check(http.post("/v1/hit", json={"policy": "nope", "key": "k"}).json(), "Error")
    check(http.get("/healthz").json(), "Health")
    for policy in http.get("/v1/policies").json()["policies"]:
        check(policy, "Policy")
    with pytest.raises(jsonschema.ValidationError):
        check({"allowed": "yes"}, "Decision")


def test_kill_switch_toggle(http: httpx.Client) -> None:
    url = "/v1/admin/policies/three"
    assert http.post(url, json={"enabled": False}).status_code == 403
    r = http.post(url, json={"enabled": False}, headers=ADMIN_H)
    assert r.json()["enabled"] is False
    results = [http.post("/v1/hit", json={"policy": "three", "key": "ks"}) for _ in range(5)]
    assert all(r.json()["allowed"] for r in results)
    assert http.post(url, json={"enabled": "no"}, headers=ADMIN_H).json()["field"] == "enabled"
    http.post(url, json={"enabled": True}, headers=ADMIN_H)
    assert http.post("/v1/peek", json={"policy": "three", "key": "ks"}).json()["remaining"] == 3


def test_block_toggle_rejects_everything_until_lifted(
    http: httpx.Client, service: ServiceProcess
) -> None:
    """The emergency stop: a blocked rate policy rejects on HTTP and ShouldRateLimit alike
    (and sends Envoy's quota buckets DENY_ALL: tests/service/rlqs)."""
    url = "/v1/admin/policies/three"
    body = {"policy": "three", "key": "blocked"}
    r = http.post(url, json={"block": True}, headers=ADMIN_H)
    assert r.status_code == 200 and r.json()["blocked"] is True
    try:
        answer = http.post("/v1/hit", json=body).json()
        assert answer["allowed"] is False and answer["retry_after"] is None
        toggled = http.post(url, json={"enabled": False}, headers=ADMIN_H).json()
        assert toggled["blocked"] is True  # block wins over the kill switch's allow
        assert http.post("/v1/hit", json=body).json()["allowed"] is False
    finally:
        http.post(url, json={"block": False, "enabled": True}, headers=ADMIN_H)
    assert http.post("/v1/hit", json=body).json()["allowed"] is True
    assert http.get("/v1/policies").json()["policies"][0]["blocked"] is False
    refused = http.post("/v1/admin/policies/slots", json={"block": True}, headers=ADMIN_H)
    assert refused.status_code == 400 and refused.json()["field"] == "block"
    ip = next(p["name"] for p in http.get("/v1/policies").json()["policies"]
              if p["name"].startswith("edge/ip"))  # fmt: skip
    request = pb.RateLimitRequest(domain="edge", descriptors=[descriptor(("ip", "9.9.9.9"))])
    http.post(f"/v1/admin/policies/{ip}", json={"block": True}, headers=ADMIN_H)
    try:
        assert grpc_call(service, request).overall_code == pb.RateLimitResponse.OVER_LIMIT
    finally:
        http.post(f"/v1/admin/policies/{ip}", json={"block": False}, headers=ADMIN_H)
    assert grpc_call(service, request).overall_code == pb.RateLimitResponse.OK


def test_sigterm_stops_through_the_shutdown_with_exit_code_0(config_file: Path) -> None:
    proc = ServiceProcess(config_file)
    proc.signal(signal.SIGTERM)
    assert proc.proc.wait(20) == 0


def test_metrics_content(http: httpx.Client) -> None:
    for _ in range(4):
        http.post("/v1/hit", json={"policy": "three", "key": "metrics-user"})
    http.post("/v1/hit", json={"policy": "nope", "key": "m"})
    text = http.get("/metrics").text
    assert 'ratekeeper_decisions_total{outcome="allowed",policy="three"}' in text
    assert 'ratekeeper_decisions_total{outcome="rejected",policy="three"}' in text
    assert 'ratekeeper_requests_refused_total{reason="policy"}' in text
    assert "ratekeeper_store_latency_seconds_bucket" in text
    assert "ratekeeper_store_errors_total 0.0" in text
    assert "ratekeeper_policies 4.0" in text or "ratekeeper_policies 5.0" in text


def grpc_call(service: ServiceProcess, request: Any) -> Any:
    with grpc.insecure_channel(f"127.0.0.1:{service.grpc_port}") as channel:
        stub = pb_grpc.RateLimitServiceStub(channel)
        return stub.ShouldRateLimit(request, timeout=10)


def descriptor(*entries: tuple[str, str]) -> Any:
    return common_pb.RateLimitDescriptor(
        entries=[common_pb.RateLimitDescriptor.Entry(key=k, value=v) for k, v in entries]
    )


def test_grpc_should_rate_limit(service: ServiceProcess) -> None:
    OK, OVER = pb.RateLimitResponse.OK, pb.RateLimitResponse.OVER_LIMIT
    req = pb.RateLimitRequest(
        domain="edge",
        descriptors=[descriptor(("ip", "1.2.3.4")), descriptor(("plan", "internal"))],
    )
    before = int(time.time())
    first = grpc_call(service, req)
    after = int(time.time())
    assert first.overall_code == OK
    ip, internal = first.statuses
    assert ip.code == OK and ip.limit_remaining == 1
    assert ip.current_limit.requests_per_unit == 2
    assert ip.current_limit.unit == pb.RateLimitResponse.RateLimit.HOUR
    assert ip.current_limit.name == "per-ip"  # the configured rate_limit.name
    assert 0 < ip.duration_until_reset.seconds <= 3600
    # aligned to the hour, read at some second of the call
    assert ip.duration_until_reset.seconds in {3600 - t % 3600 for t in range(before, after + 1)}
    assert internal.code == OK and not internal.HasField("current_limit")
    assert internal.limit_remaining == 2**32 - 1  # unlimited
    assert not first.response_headers_to_add  # none by default, as upstream
    second = grpc_call(
        service, pb.RateLimitRequest(domain="edge", descriptors=req.descriptors, hits_addend=2)
    )
    assert second.overall_code == OVER
    assert [s.code for s in second.statuses] == [OVER, OK]
    assert second.statuses[0].limit_remaining == 0
    other = grpc_call(
        service, pb.RateLimitRequest(domain="edge", descriptors=[descriptor(("ip", "5.6.7.8"))])
    )
    assert other.overall_code == OK  # each value of a key-only descriptor has its own counter


def test_grpc_per_descriptor_hits_addend_and_limit_override(service: ServiceProcess) -> None:
    from google.protobuf.wrappers_pb2 import UInt64Value

    OK, OVER = pb.RateLimitResponse.OK, pb.RateLimitResponse.OVER_LIMIT
    Limit = common_pb.RateLimitDescriptor.RateLimitOverride
    monthly = descriptor(("ip", "9.9.9.9"))
    monthly.limit.CopyFrom(Limit(requests_per_unit=3, unit=pb.RateLimitResponse.RateLimit.MONTH))
    monthly.hits_addend.CopyFrom(UInt64Value(value=2))
    before = int(time.time())
    first = grpc_call(service, pb.RateLimitRequest(domain="edge", descriptors=[monthly]))
    after = int(time.time())
    (status,) = first.statuses
    assert status.code == OK and status.limit_remaining == 1  # 2 of the override's 3
    assert status.current_limit.unit == pb.RateLimitResponse.RateLimit.MONTH
    assert status.current_limit.requests_per_unit == 3
    assert status.current_limit.name == ""  # an override has no name, as upstream
    month = 30 * 86400
    assert status.duration_until_reset.seconds in {
        month - t % month for t in range(before, after + 1)
    }
    check = descriptor(("ip", "9.9.9.9"))
    check.limit.CopyFrom(monthly.limit)
    check.hits_addend.CopyFrom(UInt64Value(value=0))  # check only: charges nothing
    for _ in range(3):
        again = grpc_call(service, pb.RateLimitRequest(domain="edge", descriptors=[check]))
        assert again.overall_code == OK and again.statuses[0].limit_remaining == 1
    over = grpc_call(
        service, pb.RateLimitRequest(domain="edge", descriptors=[monthly], hits_addend=1)
    )
    assert over.overall_code == OVER  # the descriptor's 2 replaces the request's 1


def _bad_unit() -> Any:
    d = descriptor(("ip", "x"))
    d.limit.requests_per_unit = 5  # unit left UNKNOWN
    return d


def _bad_hits() -> Any:
    d = descriptor(("ip", "x"))
    d.hits_addend.value = 2**40
    return d


@pytest.mark.parametrize(
    "request_",
    [
        pb.RateLimitRequest(domain="edge", descriptors=[_bad_unit()]),
        pb.RateLimitRequest(domain="edge", descriptors=[_bad_hits()]),
        pb.RateLimitRequest(domain="", descriptors=[descriptor(("ip", "x"))]),
        pb.RateLimitRequest(domain="edge"),
        pb.RateLimitRequest(domain="edge", descriptors=[descriptor(("ip", "x" * 40))]),
        pb.RateLimitRequest(domain="edge", descriptors=[descriptor(("ip", "x"))] * 257),
        pb.RateLimitRequest(domain="edge", descriptors=[descriptor(*[("ip", "x")] * 9)] * 250),
    ],
)
def test_grpc_bad_input_is_invalid_argument(service: ServiceProcess, request_: Any) -> None:
    check = descriptor(("ip", "x"))
    check.hits_addend.value = 0  # reads the counter, charges nothing
    probe = pb.RateLimitRequest(domain="edge", descriptors=[check])
    before = grpc_call(service, probe).statuses[0]
    with pytest.raises(grpc.RpcError) as info:
        grpc_call(service, request_)
    assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    after = grpc_call(service, probe).statuses[0]
    # nothing was charged; the time to the aligned reset may have moved on by a second
    assert (after.code, after.limit_remaining) == (before.code, before.limit_remaining)
    assert after.current_limit == before.current_limit


def test_grpc_unknown_domain_and_empty_descriptor_are_ok(service: ServiceProcess) -> None:
    """As upstream: an unknown domain limits nothing (also with a limit override), and a
    descriptor without entries matches nothing."""
    override = descriptor(("ip", "x"))
    override.limit.requests_per_unit = 0  # always over, if it applied
    override.limit.unit = pb.RateLimitResponse.RateLimit.SECOND
    for request in [
        pb.RateLimitRequest(domain="missing", descriptors=[descriptor(("ip", "x")), override]),
        pb.RateLimitRequest(domain="edge", descriptors=[common_pb.RateLimitDescriptor()]),
    ]:
        answer = grpc_call(service, request)
        assert answer.overall_code == pb.RateLimitResponse.OK
        assert all(s.code == pb.RateLimitResponse.OK for s in answer.statuses)


def test_reload_keeps_old_config_on_error(tmp_path: Path) -> None:
    path = tmp_path / "reload.yaml"
    path.write_text("policies:\n  one:\n    rate: 1/hour\n")
    proc = ServiceProcess(path, grpc=False)
    try:
        with httpx.Client(base_url=proc.url, timeout=10) as http:
            assert http.post("/v1/hit", json={"policy": "one", "key": "r"}).json()["allowed"]
            path.write_text("policies:\n  one:\n    rate: 1/fortnight\n")
            r = http.post("/v1/admin/reload", json={})
            assert r.status_code == 422 and r.json()["reloaded"] is False
            assert r.json()["error"].startswith(f"{path}:3: ")
            hit = http.post("/v1/hit", json={"policy": "one", "key": "r"}).json()
            assert hit["allowed"] is False  # the old config (and its counters) still run
            path.write_text("policies:\n  one:\n    rate: 5/hour\n  two:\n    rate: 1/hour\n")
            assert http.post("/v1/admin/reload", json={}).json()["reloaded"] is True
            assert http.post("/v1/hit", json={"policy": "two", "key": "r"}).json()["allowed"]
            path.write_text("policies:\n  three:\n    rate: 1/hour\n")
            proc.signal(signal.SIGHUP)
            deadline = time.monotonic() + 10
            while time.monotonic() < deadline:
                if http.post("/v1/peek", json={"policy": "three", "key": "r"}).status_code == 200:
                    break
                time.sleep(0.05)
            assert http.post("/v1/hit", json={"policy": "two", "key": "r"}).status_code == 404
            path.write_text("policies: [")
            proc.signal(signal.SIGHUP)
            deadline = time.monotonic() + 10
            text = ""
            while time.monotonic() < deadline and 'result="error"} 2.0' not in text:
                text = http.get("/metrics").text
                time.sleep(0.05)
            assert 'ratekeeper_config_reloads_total{result="error"} 2.0' in text
            assert http.post("/v1/peek", json={"policy": "three", "key": "r"}).status_code == 200
    finally:
        stderr = proc.stop()
    assert "keeping the running config" in stderr


def test_the_banner_says_which_envoy_services_grpc_serves() -> None:
    """grpc.aio serves the rate-limit and the quota service; ``--grpc-threads`` only RLS."""
    proc = ServiceProcess(grpc=True, extra=("--grpc-threads", "2"))
    try:
        assert "and gRPC (Envoy RLS) on 127.0.0.1:" in proc.banner
    finally:
        proc.stop()


def test_invalid_config_refused_at_start(tmp_path: Path) -> None:
    path = tmp_path / "bad.yaml"
    path.write_text("policies:\n  a:\n    rate: 10/minute\n    algorithm: leaky\n")
    out = run_serve("--config", str(path), "--port", "0", "--no-grpc")
    assert out.returncode == 2
    assert f"{path}:4: algorithm 'leaky' is unknown" in out.stderr


def test_no_arguments_serves_the_example() -> None:
    proc = ServiceProcess(grpc=True)
    try:
        assert proc.banner.startswith("ratekeeper serving HTTP on http://127.0.0.1:")
        assert "and gRPC (Envoy RLS and RLQS) on 127.0.0.1:" in proc.banner
        assert "[store: memory]" in proc.banner
        assert proc.grpc_port is not None
        with httpx.Client(base_url=proc.url, timeout=10) as http:
            r = http.post("/v1/hit", json={"policy": "api.core", "key": "x"})
            assert r.status_code == 200 and r.json()["limit"] == 100
            assert http.get("/healthz").json()["store"] == "ok"
    finally:
        proc.stop()


def test_grpc_token_when_required(tmp_path: Path) -> None:
    path = tmp_path / "grpc-auth.yaml"
    path.write_text(
        CONFIG.replace(f"  admin_token: {ADMIN}\n", f"  admin_token: {ADMIN}\n  grpc: true\n")
    )
    proc = ServiceProcess(path)
    try:
        req = pb.RateLimitRequest(domain="edge", descriptors=[descriptor(("ip", "9.9.9.9"))])
        with grpc.insecure_channel(f"127.0.0.1:{proc.grpc_port}") as channel:
            stub = pb_grpc.RateLimitServiceStub(channel)
            for metadata in [(), (("authorization", f"Bearer {TOKEN}x"),)]:
                with pytest.raises(grpc.RpcError) as info:
                    stub.ShouldRateLimit(req, timeout=10, metadata=metadata)
                assert info.value.code() == grpc.StatusCode.UNAUTHENTICATED
            ok = stub.ShouldRateLimit(
                req, timeout=10, metadata=(("authorization", f"Bearer {TOKEN}"),)
            )
            assert ok.overall_code == pb.RateLimitResponse.OK
            assert ok.statuses[0].limit_remaining == 1  # the refused calls counted nothing
    finally:
        proc.stop()


@pytest.mark.parametrize(
    "flag, extra", [("--port", ()), ("--grpc-port", ()), ("--grpc-port", ("--grpc-threads", "2"))]
)
def test_a_busy_port_is_refused_cleanly(flag: str, extra: tuple[str, ...]) -> None:
    """One line, ratekeeper's, with the OS's reason: no traceback, and none of gRPC's own
    C-core lines (``E1203 ... add_port.cc] Failed to add port``) before it."""
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = str(busy.getsockname()[1])
        other = "--grpc-port" if flag == "--port" else "--port"
        out = run_serve(flag, port, other, "0", *extra)
    assert out.returncode == 2
    what = "HTTP" if flag == "--port" else "gRPC"
    assert out.stderr == (
        f"ratekeeper serve: cannot listen for {what} on 127.0.0.1:{port} ({flag}): "
        "Address already in use\n"
    )


def acquire(http: httpx.Client, policy: str, key: str) -> httpx.Response:
    return http.post("/v1/concurrency/acquire", json={"policy": policy, "key": key})


def release(http: httpx.Client, lease: object) -> httpx.Response:
    return http.post("/v1/concurrency/release", json={"lease": lease})


def test_concurrency_acquire_release(http: httpx.Client) -> None:
    doc = http.get("/openapi.json").json()
    lease_schema = {"$ref": "#/components/schemas/Lease", "components": doc["components"]}
    answers = [acquire(http, "slots", "conc-user") for _ in range(3)]
    assert [r.status_code for r in answers] == [200, 200, 429]
    first, second, full = (r.json() for r in answers)
    for answer in (first, second, full):
        jsonschema.validate(answer, lease_schema)
    assert first["acquired"] and first["limit"] == 2 and first["in_use"] == 1
    assert second["in_use"] == 2 and first["lease"] != second["lease"]
    assert abs(first["expires_at"] - (time.time() + 30)) < 5  # the policy's lease_ttl
    assert not full["acquired"] and full["lease"] is None and full["in_use"] == 2
    assert full["error"] == "concurrency_limited" and full["policy"] == "slots"
    assert acquire(http, "slots", "other-user").status_code == 200  # keys are independent
    assert release(http, first["lease"]).json() == {"released": True}
    assert release(http, first["lease"]).json() == {"released": False}  # already given back
    again = acquire(http, "slots", "conc-user")
    assert again.status_code == 200 and again.json()["in_use"] == 2
    metrics = http.get("/metrics").text
    assert 'outcome="rejected",policy="slots"} 1.0' in metrics
    assert 'outcome="allowed",policy="slots"} 4.0' in metrics


def test_concurrency_shadow_and_kill_switch(http: httpx.Client) -> None:
    answers = [acquire(http, "slots.shadow", "sh").json() for _ in range(2)]
    assert [a["acquired"] for a in answers] == [True, True]
    assert [a["shadow"] for a in answers] == [False, True]
    assert release(http, answers[1]["lease"]).json() == {"released": False}  # held nothing
    assert release(http, answers[0]["lease"]).json() == {"released": True}
    toggle = http.post("/v1/admin/policies/single", json={"enabled": False}, headers=ADMIN_H)
    assert toggle.status_code == 200 and toggle.json()["enabled"] is False
    assert toggle.json()["kind"] == "concurrency" and toggle.json()["capacity"] == 1
    off = [acquire(http, "single", "ks") for _ in range(3)]
    assert all(r.status_code == 200 and r.json()["in_use"] is None for r in off)
    http.post("/v1/admin/policies/single", json={"enabled": True}, headers=ADMIN_H)
    assert [acquire(http, "single", "ks").status_code for _ in range(2)] == [200, 429]


def _token(value: object) -> str:
    raw = json.dumps(value).encode()
    return base64.urlsafe_b64encode(raw).rstrip(b"=").decode()


ACQUIRE_BAD = [
    (b'{"policy": "", "key": "cb"}', "policy", 400),
    (b"{not json", "body", 400),
    (b'{"policy": "single"}', "key", 400),
    (b'{"key": "cb"}', "policy", 400),
    (b'{"policy": "nope", "key": "cb"}', "policy", 404),
    (b'{"policy": "three", "key": "cb"}', "policy", 404),  # a rate policy: no such lease policy
    (b'{"policy": "single", "key": ""}', "key", 400),
    (b'{"policy": "single", "key": 5}', "key", 400),
    (b'{"policy": "single", "key": "' + b"k" * 33 + b'"}', "key", 400),
    (
        b'{"policy": "single", "key": "cb", "cost": 1}',
        "body",
        400,
    ),  # an unknown field is reported as the body
    (b'{"policy": "single", "key": "cb", "pad": "' + b"x" * 70_000 + b'"}', "body", 413),
]
RELEASE_BAD = [
    (b"{}", "lease", 400),
    (b'{"lease": 5}', "lease", 400),
    (b'{"lease": ""}', "lease", 400),
    # a string that is no token of ours is well formed: no such lease (the OpenAPI contract)
    (b'{"lease": "not a token!"}', "lease", 404),
    (b'{"lease": "00"}', "lease", 404),
    (b'{"lease": "\\u00e9t\\u00e9"}', "lease", 404),
    (b'{"lease": "' + _token([1, 2, 3]).encode() + b'"}', "lease", 404),
    (b'{"lease": "' + _token(["single", "k" * 33, "abc"]).encode() + b'"}', "lease", 404),
    (b'{"lease": "x", "key": "cb"}', "body", 400),  # an unknown field is reported as the body
]


@pytest.mark.parametrize(
    ("path", "raw", "field", "status"),
    [("/v1/concurrency/acquire", *bad) for bad in ACQUIRE_BAD]
    + [("/v1/concurrency/release", *bad) for bad in RELEASE_BAD],
)
def test_concurrency_bad_input_is_4xx_naming_the_field_and_holds_nothing(
    http: httpx.Client, path: str, raw: bytes, field: str, status: int
) -> None:
    held = acquire(http, "single", "cb")
    assert held.status_code == 200
    r = http.post(path, content=raw, headers={"content-type": "application/json"})
    assert r.status_code == status, r.text
    assert r.json()["field"] == field and r.json()["error"]
    assert acquire(http, "single", "cb").status_code == 429  # still exactly one held
    assert release(http, held.json()["lease"]).json() == {"released": True}
    assert http.post("/v1/hit", json={"policy": "single", "key": "cb"}).json()["field"] == "policy"


def test_concurrency_auth(service: ServiceProcess) -> None:
    body = {"policy": "single", "key": "auth"}
    with httpx.Client(base_url=service.url, timeout=10) as anon:
        assert anon.post("/v1/concurrency/acquire", json=body).status_code == 401
        assert anon.post("/v1/concurrency/release", json={"lease": "x"}).status_code == 401
        held = anon.post("/v1/concurrency/acquire", json=body, headers=ADMIN_H)
        assert held.status_code == 200
        lease = {"lease": held.json()["lease"]}
        assert anon.post("/v1/concurrency/release", json=lease).status_code == 401
        assert anon.post("/v1/concurrency/release", json=lease, headers=USER).json()["released"]
        assert anon.get("/v1/concurrency/acquire", headers=USER).status_code == 405


def test_grpc_with_only_an_admin_token_requires_it(tmp_path: Path) -> None:
    """``auth.grpc: true`` with an admin token alone used to leave gRPC open."""
    path = tmp_path / "admin-only.yaml"
    path.write_text(CONFIG.replace(f"  token: {TOKEN}\n", "").replace(
        f"  admin_token: {ADMIN}\n", f"  admin_token: {ADMIN}\n  grpc: true\n"
    ))  # fmt: skip
    proc = ServiceProcess(path)
    try:
        req = pb.RateLimitRequest(domain="edge", descriptors=[descriptor(("ip", "8.8.8.8"))])
        with grpc.insecure_channel(f"127.0.0.1:{proc.grpc_port}") as channel:
            stub = pb_grpc.RateLimitServiceStub(channel)
            with pytest.raises(grpc.RpcError) as info:
                stub.ShouldRateLimit(req, timeout=10)
            assert info.value.code() == grpc.StatusCode.UNAUTHENTICATED
            ok = stub.ShouldRateLimit(
                req, timeout=10, metadata=(("authorization", f"Bearer {ADMIN}"),)
            )
            assert ok.overall_code == pb.RateLimitResponse.OK
    finally:
        proc.stop()


def test_grpc_reply_that_could_be_too_large_is_refused_before_counting() -> None:
    from ratekeeper.errors import BadRequest
    from ratekeeper.service.envoy.servicer import MAX_REPLY_BYTES, check_reply_size

    big = descriptor(*[("k", "v" * 1100)] * 8)  # within max_descriptors and max_entries
    request = pb.RateLimitRequest(domain="edge", descriptors=[big] * 256)
    assert 2 * request.ByteSize() > MAX_REPLY_BYTES
    check_reply_size(request, dynamic_metadata=False)  # statuses alone stay small
    with pytest.raises(BadRequest, match="could exceed"):
        check_reply_size(request, dynamic_metadata=True)  # the metadata echoes the request


FREEZE_PROBE = """
import gc, sys, threading
from ratekeeper.service.server import ServeOptions, serve

def watch():  # report the heap's frozen objects when asked (once the banner is out)
    sys.stdin.readline()
    print("frozen", gc.get_freeze_count(), flush=True)

threading.Thread(target=watch, daemon=True).start()
sys.exit(serve(ServeOptions((sys.argv[1],), port=0, grpc_port=0)))
"""


def test_serving_process_freezes_its_startup_heap(tmp_path: Path) -> None:
    """``serve`` moves what startup made out of the cyclic collector's reach (``freeze_heap``),
    so a full collection later does not stall requests; a test serving in-process does not."""
    import gc
    import subprocess
    import sys

    path = tmp_path / "c.yaml"
    path.write_text("store: memory\npolicies:\n  p:\n    rate: 5/second\n")
    proc = subprocess.Popen(
        [sys.executable, "-c", FREEZE_PROBE, str(path)],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    assert proc.stdin is not None and proc.stdout is not None
    banner = proc.stdout.readline()
    assert "serving HTTP" in banner, banner
    proc.stdout.readline()  # the config line
    proc.stdin.write("\n")
    proc.stdin.flush()
    frozen = proc.stdout.readline()
    proc.kill()
    proc.wait(20)
    assert frozen.startswith("frozen "), frozen
    assert int(frozen.split()[1]) > 10_000  # modules, protobuf descriptors, the config
    assert gc.get_freeze_count() == 0  # this test process's own services never froze it
