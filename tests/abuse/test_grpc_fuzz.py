"""Fuzzing the gRPC API (Envoy's ShouldRateLimit) of a real ``ratekeeper serve`` process:
every request is answered OK/OVER_LIMIT or refused as INVALID_ARGUMENT naming the field
(``domain:``, ``descriptors:``, ``hits_addend:``), never UNKNOWN/INTERNAL (a bug of ours), and
the service logs no traceback."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest
from envoy.extensions.common.ratelimit.v3 import ratelimit_pb2 as common_pb
from envoy.service.ratelimit.v3 import rls_pb2 as pb
from envoy.service.ratelimit.v3 import rls_pb2_grpc as pb_grpc
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.service.proc import ServiceProcess

CONFIG = """\
limits:
  max_key_length: 256
domains:
  - domain: edge
    descriptors:
      - key: ip
        rate_limit: {unit: minute, requests_per_unit: 5}
      - key: user
        value: vip
        rate_limit: {unlimited: true}
      - key: user
        descriptors:
          - key: path
            rate_limit: {unit: second, requests_per_unit: 2}
  - domain: a/b
    descriptors:
      - key: c
        rate_limit: {unit: hour, requests_per_unit: 0}
"""
EXAMPLES = int(os.environ.get("RATEKEEPER_FUZZ_EXAMPLES", "200"))
TEXT = st.one_of(
    st.sampled_from(["ip", "user", "vip", "path", "c", "k=v", "", "edge", "a/b"]),
    st.text(max_size=12),
    st.text(min_size=200, max_size=300),
)
ENTRIES = st.lists(st.tuples(TEXT, TEXT), max_size=4)
REFUSED_FIELDS = ("domain: ", "descriptors: ", "hits_addend: ")


@pytest.fixture(scope="module")
def stub(tmp_path_factory: pytest.TempPathFactory) -> Iterator[pb_grpc.RateLimitServiceStub]:
    path: Path = tmp_path_factory.mktemp("grpc-fuzz") / "ratekeeper.yaml"
    path.write_text(CONFIG)
    proc = ServiceProcess(path)
    channel = grpc.insecure_channel(f"127.0.0.1:{proc.grpc_port}")
    yield pb_grpc.RateLimitServiceStub(channel)
    channel.close()
    stderr = proc.stop()
    assert "Traceback" not in stderr, stderr


@settings(
    max_examples=EXAMPLES,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)
@given(
    domain=TEXT,
    descriptors=st.lists(ENTRIES, max_size=4),
    hits=st.one_of(st.integers(0, 3), st.integers(0, 2**32 - 1)),
)
def test_every_request_is_answered_or_refused_naming_the_field(
    stub: pb_grpc.RateLimitServiceStub,
    domain: str,
    descriptors: list[list[tuple[str, str]]],
    hits: int,
) -> None:
    request = pb.RateLimitRequest(
        domain=domain,
        descriptors=[
            common_pb.RateLimitDescriptor(
                entries=[common_pb.RateLimitDescriptor.Entry(key=k, value=v) for k, v in entries]
            )
            for entries in descriptors
        ],
        hits_addend=hits,
    )
    try:
        response = stub.ShouldRateLimit(request, timeout=10)
    except grpc.RpcError as exc:
        assert exc.code() == grpc.StatusCode.INVALID_ARGUMENT, (exc.code(), exc.details())
        assert (exc.details() or "").startswith(REFUSED_FIELDS), exc.details()
        return
    assert len(response.statuses) == len(descriptors)
    assert response.overall_code in (pb.RateLimitResponse.OK, pb.RateLimitResponse.OVER_LIMIT)
