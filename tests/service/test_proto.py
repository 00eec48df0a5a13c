"""The committed gRPC code is what scripts/gen_proto makes from rls.proto, and the field
numbers are Envoy's (so Envoy's own client and ours read each other's bytes)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from ratekeeper.service.proto import rls_pb2 as pb

SRC = Path(__file__).resolve().parents[2] / "src"
PROTO = "ratekeeper/service/proto/rls.proto"


def test_generated_code_is_up_to_date(tmp_path: Path) -> None:
    pytest.importorskip("grpc_tools")
    subprocess.run(
        [sys.executable, "-m", "grpc_tools.protoc", "-I", str(SRC), f"--python_out={tmp_path}",
         f"--pyi_out={tmp_path}", f"--grpc_python_out={tmp_path}", str(SRC / PROTO)],
        check=True,
    )  # fmt: skip
    for name in ("rls_pb2.py", "rls_pb2.pyi", "rls_pb2_grpc.py"):
        fresh = (tmp_path / "ratekeeper/service/proto" / name).read_text()
        committed = (SRC / "ratekeeper/service/proto" / name).read_text()
        assert fresh == committed, f"{name} is stale: run scripts/gen_proto"


def test_field_numbers_are_envoys() -> None:
    def numbers(message: type) -> dict[str, int]:
        return {f.name: f.number for f in message.DESCRIPTOR.fields}  # type: ignore[attr-defined]

    assert numbers(pb.RateLimitRequest) == {"domain": 1, "descriptors": 2, "hits_addend": 3}
    assert numbers(pb.RateLimitDescriptor) == {"entries": 1, "limit": 2, "hits_addend": 3}
    assert numbers(pb.RateLimitDescriptor.RateLimitOverride) == {"requests_per_unit": 1, "unit": 2}
    unit = pb.RateLimitResponse.RateLimit.Unit
    assert dict(unit.items()) == {
        "UNKNOWN": 0, "SECOND": 1, "MINUTE": 2, "HOUR": 3, "DAY": 4, "MONTH": 5, "YEAR": 6,
        "WEEK": 7,
    }  # fmt: skip
    assert numbers(pb.RateLimitDescriptor.Entry) == {"key": 1, "value": 2}
    assert numbers(pb.RateLimitResponse) == {
        "overall_code": 1,
        "statuses": 2,
        "response_headers_to_add": 3,
        "request_headers_to_add": 4,
    }
    assert numbers(pb.RateLimitResponse.DescriptorStatus) == {
        "code": 1,
        "current_limit": 2,
        "limit_remaining": 3,
        "duration_until_reset": 4,
    }
    assert numbers(pb.RateLimitResponse.RateLimit) == {
        "requests_per_unit": 1,
        "unit": 2,
        "name": 3,
    }
    assert (
        pb.RateLimitResponse.DESCRIPTOR.full_name == "envoy.service.ratelimit.v3.RateLimitResponse"
    )
