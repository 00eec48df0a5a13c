"""deploy/prometheus/alerts.yaml against a real Prometheus (Debian's package) scraping a real
``ratekeeper serve``: a refused reload makes RatekeeperConfigReloadFailed fire, which needs
the error counter at zero before the first failure (zero-initialised series)."""

from __future__ import annotations

import json
import shutil
import signal
import subprocess
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.service.envoy_proxy import free_port
from tests.service.proc import IMAGE_ROOT, ServiceProcess

RULES = Path(__file__).resolve().parents[2] / "deploy" / "prometheus" / "alerts.yaml"
POLICY = "policies:\n  api: {rate: 10/second}\n"


@pytest.fixture
def service(tmp_path: Path) -> Iterator[ServiceProcess]:
    if IMAGE_ROOT:
        pytest.skip("the image is tested by its own smoke tests")
    (tmp_path / "config").mkdir()
    (tmp_path / "config" / "limits.yaml").write_text(POLICY)
    proc = ServiceProcess(tmp_path / "config", grpc=False)
    yield proc
    proc.stop()


def query(port: int, path: str) -> dict[str, object]:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=5) as answer:
        body: dict[str, object] = json.load(answer)
    return body


def test_a_refused_reload_fires_the_alert(tmp_path: Path, service: ServiceProcess) -> None:
    binary = shutil.which("prometheus")
    if binary is None:
        pytest.skip("prometheus is not installed (./scripts/test installs Debian's)")
    port = free_port()
    (tmp_path / "prometheus.yml").write_text(
        "global: {scrape_interval: 1s, evaluation_interval: 1s}\n"
        f"rule_files: [{RULES}]\n"
        "scrape_configs:\n"
        "  - job_name: ratekeeper\n"
        f"    static_configs: [{{targets: ['127.0.0.1:{service.port}']}}]\n"
    )
    prometheus = subprocess.Popen(
        [binary, f"--config.file={tmp_path / 'prometheus.yml'}",
         f"--storage.tsdb.path={tmp_path / 'data'}",
         f"--web.listen-address=127.0.0.1:{port}"],
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 40

        def up() -> bool:
            try:
                result = query(port, "/api/v1/query?query=up")["data"]
            except OSError:
                return False
            return any(r["value"][1] == "1" for r in result["result"])  # type: ignore[index]

        while not up():
            assert time.monotonic() < deadline, "Prometheus never scraped the service"
            time.sleep(0.5)
        time.sleep(2)  # a few scrapes of the zero before the failure
        (tmp_path / "config" / "limits.yaml").write_text("policies:\n  api: {rate: 10/fortnight}\n")
        service.signal(signal.SIGHUP)
        while True:
            alerts = query(port, "/api/v1/alerts")["data"]["alerts"]  # type: ignore[index]
            name = "RatekeeperConfigReloadFailed"
            firing = [
                a for a in alerts if a["labels"]["alertname"] == name and a["state"] == "firing"
            ]
            if firing:
                break
            assert time.monotonic() < deadline, alerts
            time.sleep(0.5)
        assert firing[0]["labels"]["instance"] == f"127.0.0.1:{service.port}"
    finally:
        prometheus.send_signal(signal.SIGTERM)
        prometheus.wait(10)


def test_metrics_in_openmetrics_when_asked(service: ServiceProcess) -> None:
    import httpx
    from prometheus_client.openmetrics.parser import text_string_to_metric_families

    url = f"{service.url}/metrics"
    asked = httpx.get(url, headers={"accept": "application/openmetrics-text; version=1.0.0"})
    assert asked.headers["content-type"].startswith("application/openmetrics-text")
    assert asked.text.endswith("# EOF\n")
    families = {f.name: f for f in text_string_to_metric_families(asked.text)}
    reloads = families["ratekeeper_config_reloads"]
    assert {
        (s.labels["result"], s.value) for s in reloads.samples if s.name.endswith("_total")
    } == {
        ("ok", 0.0),
        ("error", 0.0),
    }
    plain = httpx.get(url, headers={"accept": "text/plain"})
    assert plain.headers["content-type"].startswith("text/plain; version=0.0.4")
    assert "# EOF" not in plain.text
    scraper = "application/openmetrics-text;version=1.0.0,text/plain;version=0.0.4;q=0.5,*/*;q=0.1"
    assert httpx.get(url, headers={"accept": scraper}).text.endswith("# EOF\n")


def test_every_configured_policy_starts_at_zero(service: ServiceProcess) -> None:
    import httpx

    text = httpx.get(f"{service.url}/metrics").text
    for outcome in ("allowed", "rejected", "local_rejected", "shadow_rejected", "degraded"):
        assert f'ratekeeper_decisions_total{{outcome="{outcome}",policy="api"}} 0.0' in text


def test_zeroing_leaves_half_the_series_cap_to_traffic() -> None:
    from ratekeeper.service.metrics import Metrics

    metrics = Metrics()
    cap = metrics.decisions.max_series
    zeroed = metrics.zero(f"p{i}" for i in range(cap))
    assert 0 < zeroed < cap and len(metrics.decisions.series) <= cap // 2
    metrics.decision("fresh", "rejected")  # traffic still gets a series of its own
    assert metrics.count_of("fresh", "rejected") == 1
