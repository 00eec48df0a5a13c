"""The service's /dashboard in real headless Chromium against a real ``ratekeeper serve``."""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.browser import Browser
from tests.service.proc import ServiceProcess

TOKEN = "client-token-dashboard-01234"
ADMIN = "admin-token-dashboard-012345"
CONFIG = f"""\
auth:
  token: {TOKEN}
  admin_token: {ADMIN}
policies:
  api.core:
    rate: 5/hour
  api.beta:
    rate: 2/hour
    shadow: true
"""


@pytest.fixture
def browser() -> Iterator[Browser]:
    b = Browser()
    yield b
    b.close()


@pytest.fixture
def service(tmp_path: Path) -> Iterator[ServiceProcess]:
    path = tmp_path / "ratekeeper.yaml"
    path.write_text(CONFIG)
    proc = ServiceProcess(path, grpc=False)
    yield proc
    proc.stop()


def metric(text: str, policy: str, outcome: str) -> float:
    m = re.search(
        rf'^ratekeeper_decisions_total\{{outcome="{outcome}",policy="{policy}"\}} (\S+)$',
        text,
        re.M,
    )
    return float(m.group(1)) if m else 0.0


def test_dashboard_shows_what_metrics_count_and_toggles_need_the_admin_token(
    browser: Browser, service: ServiceProcess
) -> None:
    auth = {"Authorization": f"Bearer {TOKEN}"}
    with httpx.Client(base_url=service.url, timeout=10, headers=auth) as http:
        for _ in range(8):  # known traffic: 5 allowed and 3 rejected on one key
            http.post("/v1/hit", json={"policy": "api.core", "key": "heavy"})
        http.post("/v1/hit", json={"policy": "api.core", "key": "light"})
        for _ in range(4):
            http.post("/v1/hit", json={"policy": "api.beta", "key": "heavy"})
        metrics = http.get("/metrics").text

    browser.open(service.url + "/healthz")  # same origin: the session keeps the token
    browser.evaluate(f"sessionStorage.setItem('rk-token', {TOKEN!r})")
    browser.open(service.url + "/dashboard?interval=300")
    browser.wait_for("document.querySelector('tr[data-policy=\"api.core\"]') !== null")
    assert browser.errors == []

    def shown(policy: str, outcome: str) -> float:
        return float(browser.evaluate(
            f"document.querySelector('tr[data-policy=\"{policy}\"] "
            f"td[data-outcome=\"{outcome}\"]').textContent"
        ))  # fmt: skip

    for policy, outcome in [("api.core", "allowed"), ("api.beta", "shadow_rejected"),
                            ("api.beta", "allowed")]:  # fmt: skip
        assert shown(policy, outcome) == metric(metrics, policy, outcome), (policy, outcome)
    # "rejected" on the page: by the store and by the over-limit cache together
    rejected = metric(metrics, "api.core", "rejected") + metric(
        metrics, "api.core", "local_rejected"
    )
    assert shown("api.core", "rejected") == rejected == 3
    top = browser.evaluate("document.querySelector('#top-keys tbody').textContent")
    assert "heavy" in top and "light" not in top
    # the incident view: the configured limit, when a key was first and last limited, the zone
    limit = browser.evaluate(
        "document.querySelector('tr[data-policy=\"api.core\"] td.limit').textContent"
    )
    assert limit == "5/hour (fixed_window)", limit
    seen = browser.evaluate("document.querySelector('#top-keys td.last-seen').textContent")
    assert re.fullmatch(r"\d\d:\d\d:\d\d UTC[+-]\d\d:\d\d \(\d+ s ago\)", seen), seen
    assert "UTC" in browser.evaluate("document.getElementById('status').textContent")
    assert browser.evaluate("document.querySelectorAll('td.shadow-rate').length") == 2
    breakers = browser.evaluate("document.querySelector('#breakers tbody').textContent")
    assert "memory" in breakers and "closed" in breakers
    browser.screenshot("dashboard")

    # a toggle without the admin token (the client token) is refused and changes nothing
    browser.evaluate(
        'document.querySelector(\'tr[data-policy="api.core"] button[data-mode="off"]\').click()'
    )
    assert browser.wait_for("document.getElementById('msg').getAttribute('data-status')") == "403"
    with httpx.Client(base_url=service.url, timeout=10, headers=auth) as http:
        assert (
            http.post("/v1/hit", json={"policy": "api.core", "key": "heavy"}).json()["allowed"]
            is False
        )
    # with the admin token: the kill switch turns the policy off
    browser.evaluate(
        f"tokenInput.value = {ADMIN!r};"
        "document.getElementById('msg').removeAttribute('data-status')"
    )
    browser.evaluate(
        'document.querySelector(\'tr[data-policy="api.core"] button[data-mode="off"]\').click()'
    )
    assert browser.wait_for("document.getElementById('msg').getAttribute('data-status')") == "200"
    browser.wait_for(
        "document.querySelector('tr[data-policy=\"api.core\"] button.on').textContent === 'off'"
    )
    with httpx.Client(base_url=service.url, timeout=10, headers=auth) as http:
        assert (
            http.post("/v1/hit", json={"policy": "api.core", "key": "heavy"}).json()["allowed"]
            is True
        )
        browser.wait_for(  # the disabled column counts what the kill switch let through
            'document.querySelector(\'tr[data-policy="api.core"] '
            "td[data-outcome=\"disabled\"]').textContent === '1'"
        )
        policies = http.get("/v1/policies").json()["policies"]
        assert next(p for p in policies if p["name"] == "api.core")["enabled"] is False
        refused = http.post("/dashboard/modes", json={"name": "api.core", "mode": "enforce"})
        assert refused.status_code == 403


def test_dashboard_data_needs_the_client_token(service: ServiceProcess) -> None:
    with httpx.Client(base_url=service.url, timeout=10) as http:
        assert http.get("/dashboard").status_code == 200
        assert http.get("/dashboard/data").status_code == 401
        page = http.get("/dashboard").text
        assert "http://" not in page.replace("http://www.w3.org/2000/svg", "")
        assert "https://" not in page and '<link rel="stylesheet"' not in page


def test_dashboard_shows_envoys_quota_buckets(browser: Browser, tmp_path: Path) -> None:
    from tests.service.rlqs.client import QuotaClient

    path = tmp_path / "ratekeeper.yaml"
    path.write_text(
        CONFIG
        + """\
  tenant.quota:
    rate: 50/second
rlqs:
  buckets:
    - domain: edge
      bucket: {name: tenant, tenant: "*"}
      policy: tenant.quota
"""
    )
    proc = ServiceProcess(path)
    assert proc.grpc_port is not None
    client = QuotaClient(proc.grpc_port)
    try:
        client.send("edge", ({"name": "tenant", "tenant": "acme"}, 0, 1, 0))
        client.next()
        browser.open(proc.url + "/healthz")
        browser.evaluate(f"sessionStorage.setItem('rk-token', {TOKEN!r})")
        browser.open(proc.url + "/dashboard?interval=300")
        browser.wait_for("!document.getElementById('rlqs').hidden")
        assert browser.errors == []
        row = browser.evaluate("document.querySelector('#quota-buckets tbody tr').textContent")
        assert row.startswith("edge/name=tenant,tenant=acmetenant.quotaquota50")
        browser.screenshot("dashboard-rlqs")
    finally:
        client.close()
        proc.stop()
