"""deploy/grafana-dashboard.json stays in step with the metric vocabulary."""

from __future__ import annotations

import json
import re
from pathlib import Path

from ratekeeper.metrics import METRICS, OUTCOMES

DASHBOARD = Path(__file__).resolve().parents[2] / "deploy" / "grafana-dashboard.json"
SUFFIXES = {"counter": ("_total",), "gauge": ("",), "histogram": ("_bucket", "_sum", "_count")}


def expressions() -> list[str]:
    doc = json.loads(DASHBOARD.read_text())
    return [t["expr"] for p in doc["panels"] for t in p["targets"]]


def test_every_series_in_the_dashboard_is_one_ratekeeper_exposes() -> None:
    exposed = {s.name + suffix: s for s in METRICS for suffix in SUFFIXES[s.kind]}
    used = set()
    for expr in expressions():
        for name in re.findall(r"\bratekeeper_[a-z_]+", expr):
            assert name in exposed, f"{name} (in {expr}) is no metric of the vocabulary"
            spec = exposed[name]
            used.add(spec.name)
            labels = set(spec.labels) | ({"le"} if spec.kind == "histogram" else set())
            for group in re.findall(r"by \(([^)]*)\)", expr):
                for label in (x.strip() for x in group.split(",")):
                    assert label in labels, f"{label} is no label of {spec.name} ({expr})"
            for label, value in re.findall(r'(\w+)=~?"([^"]*)"', expr):
                assert label in labels, f"{label} is no label of {spec.name} ({expr})"
                if label == "outcome":
                    assert set(value.split("|")) <= set(OUTCOMES), value
    assert used == {s.name for s in METRICS}, "every metric has a panel"


def test_the_dashboard_is_valid_grafana_json() -> None:
    doc = json.loads(DASHBOARD.read_text())
    assert doc["uid"] == "ratekeeper" and doc["panels"]
    ids = [p["id"] for p in doc["panels"]]
    assert len(ids) == len(set(ids))
    for p in doc["panels"]:
        assert p["targets"] and all(t["refId"] for t in p["targets"])
