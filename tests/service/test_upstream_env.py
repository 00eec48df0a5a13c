"""``ratekeeper serve`` configured as envoyproxy/ratelimit's deployments configure upstream's
binary: environment variables only, no flag. It serves the runtime directory from the Redis of
``REDIS_URL``, answers ``/healthcheck`` on ``PORT`` and Envoy on ``GRPC_PORT``, sends
upstream's statsd names to ``STATSD_HOST:STATSD_PORT`` and logs JSON. Under scripts/test-image
the same process runs from the container image's filesystem (tests/service/proc.py)."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import grpc
import httpx
import pytest
import redis
from envoy.extensions.common.ratelimit.v3 import ratelimit_pb2 as common_pb
from envoy.service.ratelimit.v3 import rls_pb2 as pb
from envoy.service.ratelimit.v3 import rls_pb2_grpc as pb_grpc

from tests.service.envoy_proxy import free_port
from tests.service.proc import IMAGE, IMAGE_ROOT, ServiceProcess, in_image, readable

DOMAIN = """\
domain: edge
descriptors:
  - key: user
    rate_limit: {unit: minute, requests_per_unit: 3}
"""


def inside(path: Path) -> str:
    """``path`` as the service sees it (inside the image under scripts/test-image)."""
    text = str(path)
    return text.removeprefix(IMAGE_ROOT) if IMAGE_ROOT else text


def start(env: dict[str, str]) -> ServiceProcess:
    """``ratekeeper serve`` with no flag and ``env`` (in the image when testing it)."""
    if IMAGE_ROOT:
        return ServiceProcess(argv=in_image([], env))
    return ServiceProcess(argv=[sys.executable, "-m", "ratekeeper.cli", "serve"], env=env)


@pytest.fixture
def statsd() -> Iterator[socket.socket]:
    listener = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    listener.bind(("127.0.0.1", 0))
    listener.settimeout(0.2)
    yield listener
    listener.close()


def received(listener: socket.socket, wanted: dict[str, int], seconds: float) -> dict[str, int]:
    """statsd counters summed over the datagrams that arrive until ``wanted`` is met."""
    totals: dict[str, int] = {}
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        try:
            data = listener.recv(65536).decode()
        except TimeoutError:
            continue
        for line in data.splitlines():
            name, _, rest = line.partition(":")
            value, _, kind = rest.partition("|")
            assert kind == "c", line
            totals[name] = totals.get(name, 0) + int(value)
        if all(totals.get(k, 0) >= v for k, v in wanted.items()):
            break
    return totals


def upstream_env(tmp_path: Path, redis_url: str, statsd_port: int) -> dict[str, str]:
    config = tmp_path / "runtime" / "ratelimit" / "config"
    config.mkdir(parents=True)
    (config / "edge.yaml").write_text(DOMAIN)
    readable(str(tmp_path / "runtime"))  # for the image's user, under scripts/test-image
    host_port = redis_url.removeprefix("redis://").split("/")[0]
    return {
        "REDIS_SOCKET_TYPE": "tcp",
        "REDIS_URL": host_port,
        "REDIS_TYPE": "SINGLE",
        "RUNTIME_ROOT": inside(tmp_path / "runtime"),
        "RUNTIME_SUBDIRECTORY": "ratelimit",
        "RUNTIME_APPDIRECTORY": "config",
        "RUNTIME_IGNOREDOTFILES": "true",
        "HOST": "127.0.0.1",  # loopback only in tests; upstream's default is every address
        "GRPC_HOST": "127.0.0.1",
        "PORT": str(free_port()),
        "GRPC_PORT": str(free_port()),
        "USE_STATSD": "true",
        "STATSD_HOST": "127.0.0.1",
        "STATSD_PORT": str(statsd_port),
        "STATS_FLUSH_INTERVAL": "500ms",
        "LOG_LEVEL": "info",
        "LOG_FORMAT": "json",
    }


def call(port: int, user: str) -> int:
    request = pb.RateLimitRequest(
        domain="edge",
        descriptors=[
            common_pb.RateLimitDescriptor(
                entries=[common_pb.RateLimitDescriptor.Entry(key="user", value=user)]
            )
        ],
    )
    with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
        answer = pb_grpc.RateLimitServiceStub(channel).ShouldRateLimit(request, timeout=10)
    code: int = answer.overall_code
    return code


def test_upstreams_environment_alone_serves_from_redis_with_statsd_and_json_logs(
    tmp_path: Path, redis_url: str, statsd: socket.socket
) -> None:
    env = upstream_env(tmp_path, redis_url, statsd.getsockname()[1])
    service = start(env)
    try:
        assert service.port == int(env["PORT"]) and service.grpc_port == int(env["GRPC_PORT"])
        assert "[store: redis]" in service.banner
        health = httpx.get(f"http://127.0.0.1:{env['PORT']}/healthcheck", timeout=10)
        assert health.status_code == 200
        codes = [call(int(env["GRPC_PORT"]), "alice") for _ in range(4)]
        ok, over = pb.RateLimitResponse.OK, pb.RateLimitResponse.OVER_LIMIT
        assert codes == [ok, ok, ok, over]
        assert redis.Redis.from_url(redis_url).dbsize() > 0  # counted in REDIS_URL's Redis
        stat = "ratelimit.service.rate_limit.edge.user"
        wanted = {f"{stat}.total_hits": 4, f"{stat}.over_limit": 1, f"{stat}.within_limit": 3}
        totals = received(statsd, wanted, 15)
        for name, value in wanted.items():
            assert totals.get(name) == value, totals
        assert totals.get(f"{stat}.near_limit", 0) >= 1, totals  # the 3rd of 3 is near
    finally:
        stderr = service.stop()
    records = [json.loads(line) for line in stderr.splitlines() if line.strip()]
    assert all({"time", "level", "msg"} <= set(r) for r in records), stderr


def test_the_images_healthcheck_passes_against_it(
    tmp_path: Path, redis_url: str, statsd: socket.socket
) -> None:
    if not IMAGE_ROOT:
        pytest.skip("scripts/test-image runs this against the container image")
    env = upstream_env(tmp_path, redis_url, statsd.getsockname()[1])
    service = start(env)
    try:
        check = IMAGE["healthcheck"]
        assert check[:1] == ["CMD"], check
        ran = subprocess.run(in_image(check[1:], {"PORT": env["PORT"]}, entrypoint=False),
                             capture_output=True, text=True, timeout=30)  # fmt: skip
        assert ran.returncode == 0, ran.stderr
    finally:
        service.stop()


def test_a_config_path_the_user_may_not_enter_is_a_clear_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """As a non-root user meets a 0700 directory on the way (tests run as root, who passes)."""
    from ratekeeper.errors import ConfigError
    from ratekeeper.service.config import load

    private = tmp_path / "private" / "config"
    real_stat = Path.stat

    def stat(self: Path, **kwargs: bool) -> object:
        if self == private:
            raise PermissionError(13, "Permission denied", str(self))
        return real_stat(self, **kwargs)

    monkeypatch.setattr(Path, "stat", stat)
    with pytest.raises(ConfigError, match="cannot read config path: Permission denied"):
        load([str(private)], env={})
