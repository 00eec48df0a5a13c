"""The service's answers as clients read them, through a real ``ratekeeper serve``: names
outside ASCII never cost a 500 (nor a charge without an answer) and give RFC 8941 headers; a
full concurrency policy answers 429 with ``Retry-After`` and GitHub's "secondary rate limit";
a lease released after its TTL answers false."""

from __future__ import annotations

import re
import time
from collections.abc import Iterator

import http_sfv
import httpx
import pytest

from tests.service.proc import ServiceProcess

CONFIG = """\
policies:
  café:
    rate: 2/hour
  slots:
    kind: concurrency
    capacity: 1
    lease_ttl: 1
domains:
  - domain: edge
    descriptors:
      - key: city
        value: 東京
        rate_limit: {unit: hour, requests_per_unit: 2}
"""


@pytest.fixture(scope="module")
def service(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServiceProcess]:
    path = tmp_path_factory.mktemp("clients") / "svc.yaml"
    path.write_text(CONFIG, encoding="utf-8")
    proc = ServiceProcess(path, grpc=False)
    yield proc
    proc.stop()


@pytest.fixture
def http(service: ServiceProcess) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=service.url, timeout=10) as client:
        yield client


@pytest.mark.parametrize("policy", ["edge/city=東京", "café"])
def test_names_outside_ascii_are_answered_with_valid_fields(
    http: httpx.Client, policy: str
) -> None:
    answers = [http.post("/v1/hit", json={"policy": policy, "key": "k"}) for _ in range(3)]
    assert [a.status_code for a in answers] == [200, 200, 200]
    assert [a.json()["allowed"] for a in answers] == [True, True, False]  # each hit answered
    for answer in answers:
        for field in ("ratelimit", "ratelimit-policy"):
            value = answer.headers[field]
            assert value.isascii()
            http_sfv.List().parse(value.encode("ascii"))
    assert answers[-1].json()["policy"] == policy


def test_full_concurrency_policy_says_when_and_why(http: httpx.Client) -> None:
    first = http.post("/v1/concurrency/acquire", json={"policy": "slots", "key": "u"})
    assert first.status_code == 200
    full = http.post("/v1/concurrency/acquire", json={"policy": "slots", "key": "u"})
    assert full.status_code == 429
    assert int(full.headers["retry-after"]) >= 1  # urllib3.Retry and friends wait for it
    assert re.search(r"\bsecondary rate\b", full.json()["message"], re.IGNORECASE)
    time.sleep(1.2)  # lease_ttl 1 s (the service's clock is real time)
    late = http.post("/v1/concurrency/release", json={"lease": first.json()["lease"]})
    assert late.status_code == 200 and late.json() == {"released": False}
