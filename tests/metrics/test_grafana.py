"""deploy/grafana-dashboard.json stays in step with the metric vocabulary."""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ratekeeper.metrics import METRICS, OUTCOMES

DASHBOARD = Path(__file__).resolve().parents[2] / "deploy" / "grafana-dashboard.json"
SUFFIXES = {"counter": ("_total",), "gauge": ("",), "histogram": ("_bucket", "_sum", "_count")}


def expressions() -> list[str]:
    doc = json.loads(DASHBOARD.read_text())
    return [t["expr"] for p in doc["panels"] for t in p["targets"]]


TARGET_LABELS = {"instance", "job"}
"""Labels Prometheus adds to every series it scrapes (the dashboard's instance variable)."""


@dataclass(frozen=True)
class Served:
    """A family only the service exposes (Envoy's stats), as its exposition shows it."""

    name: str
    labels: tuple[str, ...]
    kind: str = "counter"


def envoy_families() -> dict[str, Served]:
    """The service's ``ratekeeper_envoy_*`` series, read from a real exposition after one
    counted Envoy limit and one unknown domain."""
    from prometheus_client.parser import text_string_to_metric_families

    from ratekeeper.service.metrics import Metrics

    metrics = Metrics()
    metrics.envoy.count("edge", "edge.user_alice", False, 1, 10, 9, False, False, False)
    metrics.envoy.not_found("nowhere")
    metrics.envoy.shadowed()
    out = {}
    for family in text_string_to_metric_families(metrics.exposition().decode()):
        if family.name.startswith("ratekeeper_envoy_"):
            for sample in family.samples:
                if sample.name.endswith("_total"):
                    out[sample.name] = Served(family.name, tuple(sorted(sample.labels)))
    return out


def test_every_series_in_the_dashboard_is_one_ratekeeper_exposes() -> None:
    exposed: dict[str, Any] = {s.name + suffix: s for s in METRICS for suffix in SUFFIXES[s.kind]}
    served = envoy_families()
    assert len(served) == 8, served  # six stats, unknown domains, global shadow mode
    exposed |= served
    used = set()
    for expr in expressions():
        for name in re.findall(r"\bratekeeper_[a-z_]+", expr):
            assert name in exposed, f"{name} (in {expr}) is no metric ratekeeper exposes"
            spec = exposed[name]
            used.add(spec.name)
            labels = set(spec.labels) | ({"le"} if spec.kind == "histogram" else set())
            for group in re.findall(r"by \(([^)]*)\)", expr):
                for label in (x.strip() for x in group.split(",")):
                    assert label in labels, f"{label} is no label of {spec.name} ({expr})"
            for label, value in re.findall(r'(\w+)=~?"([^"]*)"', expr):
                assert label in labels | TARGET_LABELS, f"{label} is no label of {spec.name}"
                if label == "outcome":
                    assert set(value.split("|")) <= set(OUTCOMES), value
    assert used >= {s.name for s in METRICS}, "every metric has a panel"
    assert used >= {s.name for s in served.values()}, "every Envoy stat has a panel"


def test_every_series_is_filtered_by_the_instance_variable() -> None:
    doc = json.loads(DASHBOARD.read_text())
    assert "instance" in [v["name"] for v in doc["templating"]["list"]]
    for expr in expressions():
        for selector in re.findall(r"ratekeeper_[a-z_]+(\{[^}]*\})?", expr):
            assert 'instance=~"$instance"' in selector, expr


def test_a_rejection_ratio_panel() -> None:
    doc = json.loads(DASHBOARD.read_text())
    ratio = [p for p in doc["panels"] if p["title"].startswith("Rejection ratio")]
    assert ratio and ratio[0]["fieldConfig"]["defaults"]["unit"] == "percentunit"
    assert " / " in ratio[0]["targets"][0]["expr"]


def test_the_dashboard_is_valid_grafana_json() -> None:
    doc = json.loads(DASHBOARD.read_text())
    assert doc["uid"] == "ratekeeper" and doc["panels"]
    ids = [p["id"] for p in doc["panels"]]
    assert len(ids) == len(set(ids))
    for p in doc["panels"]:
        assert p["targets"] and all(t["refId"] for t in p["targets"])
