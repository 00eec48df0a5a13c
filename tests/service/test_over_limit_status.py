"""``/v1/hit`` over the limit: a 200 with ``allowed: false`` by default, a 429 when the config
(``limits.over_limit_status``) or the request (``over_limit_status``) asks; through a real
``ratekeeper serve`` and checked against its OpenAPI document."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import jsonschema
import pytest

from ratekeeper.errors import ConfigError
from ratekeeper.service.config import loader as config
from tests.service.proc import ServiceProcess

POLICIES = """\
policies:
  two:
    rate: 2/hour
  quiet:
    rate: 1/hour
    shadow: true
"""


def _serve(tmp_path_factory: pytest.TempPathFactory, text: str) -> Iterator[httpx.Client]:
    path = tmp_path_factory.mktemp("over") / "ratekeeper.yaml"
    path.write_text(text)
    service = ServiceProcess(path, grpc=False)
    try:
        with httpx.Client(base_url=service.url, timeout=10) as client:
            yield client
    finally:
        service.stop()


@pytest.fixture(scope="module")
def default(tmp_path_factory: pytest.TempPathFactory) -> Iterator[httpx.Client]:
    yield from _serve(tmp_path_factory, POLICIES)


@pytest.fixture(scope="module")
def strict(tmp_path_factory: pytest.TempPathFactory) -> Iterator[httpx.Client]:
    yield from _serve(tmp_path_factory, "limits:\n  over_limit_status: 429\n" + POLICIES)


def hit(client: httpx.Client, key: str, **extra: Any) -> httpx.Response:
    return client.post("/v1/hit", json={"policy": "two", "key": key, **extra})


def documented(client: httpx.Client, response: httpx.Response) -> None:
    """The answer matches the OpenAPI document's entry for its status."""
    doc = client.get("/openapi.json").json()
    entry = doc["paths"]["/v1/hit"]["post"]["responses"][str(response.status_code)]
    schema = {**entry["content"]["application/json"]["schema"], "components": doc["components"]}
    jsonschema.validate(response.json(), schema)
    for name in entry.get("headers", {}):
        if name != "Retry-After" or not response.json()["allowed"]:
            assert name.lower() in response.headers, name


def test_over_the_limit_is_a_200_by_default(default: httpx.Client) -> None:
    answers = [hit(default, "d") for _ in range(3)]
    assert [r.status_code for r in answers] == [200, 200, 200]
    assert [r.json()["allowed"] for r in answers] == [True, True, False]
    documented(default, answers[2])


def test_a_request_may_ask_for_429(default: httpx.Client) -> None:
    first = hit(default, "r", over_limit_status=429)
    assert first.status_code == 200 and first.json()["allowed"]  # allowed: always 200
    hit(default, "r")
    over = hit(default, "r", over_limit_status=429)
    assert over.status_code == 429 and over.json()["allowed"] is False
    assert int(over.headers["retry-after"]) > 0 and over.headers["x-ratelimit-remaining"] == "0"
    documented(default, over)
    assert hit(default, "r", over_limit_status=200).status_code == 200


def test_the_config_may_make_429_the_default(strict: httpx.Client) -> None:
    answers = [hit(strict, "s") for _ in range(3)]
    assert [r.status_code for r in answers] == [200, 200, 429]
    documented(strict, answers[2])
    asked = hit(strict, "s", over_limit_status=200)  # a client that wants the 200 back
    assert asked.status_code == 200 and asked.json()["allowed"] is False


def test_a_shadow_rejection_is_allowed_so_200(strict: httpx.Client) -> None:
    for _ in range(2):
        r = strict.post("/v1/hit", json={"policy": "quiet", "key": "q"})
        assert r.status_code == 200 and r.json()["allowed"]
    assert r.json()["shadow"] is True


@pytest.mark.parametrize("value", [404, "429", True, None, 429.5])
def test_a_bad_status_is_refused_and_counts_nothing(default: httpx.Client, value: Any) -> None:
    r = hit(default, f"bad-{value!r}", over_limit_status=value)
    assert r.status_code == 400 and r.json()["field"] == "over_limit_status", r.text
    assert "expected 200 or 429" in r.json()["error"]
    peek = default.post("/v1/peek", json={"policy": "two", "key": f"bad-{value!r}"})
    assert peek.json()["remaining"] == 2


def test_only_hit_takes_the_field(default: httpx.Client) -> None:
    for route in ("/v1/peek", "/v1/refund"):
        r = default.post(route, json={"policy": "two", "key": "p", "over_limit_status": 429})
        assert r.status_code == 400 and "over_limit_status" in r.json()["error"], r.text


def test_the_config_setting_is_checked(tmp_path: Path) -> None:
    assert config.parse_text("limits:\n  over_limit_status: 429\n").over_limit_status == 429
    assert config.parse_text("policies: {}\n").over_limit_status == 200
    for bad in ("404", "true", "'429'"):
        with pytest.raises(ConfigError, match=r":2: limits.over_limit_status .* 200 or 429"):
            config.parse_text(f"limits:\n  over_limit_status: {bad}\n")
