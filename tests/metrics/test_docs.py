"""docs/observing.md: its metric table is the vocabulary, and its Python examples run."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from starlette.testclient import TestClient

from ratekeeper.metrics import METRICS

DOC = Path(__file__).resolve().parents[2] / "docs" / "observing.md"
TEXT = DOC.read_text()
BLOCKS = re.findall(r"```python\n(.*?)```", TEXT, flags=re.S)


def test_the_table_lists_every_metric_with_its_labels() -> None:
    rows = {
        m.group(1): m.group(2)
        for m in re.finditer(r"^\| `(ratekeeper_\w+)` \| \w+ \| ([^|]*) \|", TEXT, re.M)
    }
    assert set(rows) == {s.exposed for s in METRICS}
    for s in METRICS:
        assert rows[s.exposed].strip() == (", ".join(f"`{x}`" for x in s.labels) or "\N{EN DASH}")


def test_the_examples_run(tmp_path: Path) -> None:
    from prometheus_client import REGISTRY

    before = set(REGISTRY._collector_to_names)
    namespace: dict[str, Any] = {}
    try:
        exec(compile(BLOCKS[0], "prometheus-example", "exec"), namespace)
        assert namespace["metrics"].count_of("100/1m", "allowed") == 1
    finally:
        for collector in set(REGISTRY._collector_to_names) - before:
            REGISTRY.unregister(collector)
    exec(compile(BLOCKS[1], "otel-example", "exec"), {})
    mounted: dict[str, Any] = {}
    exec(compile(BLOCKS[2], "dashboard-example", "exec"), mounted)
    with TestClient(mounted["app"]) as client:
        assert client.get("/dashboard").status_code == 200
        assert client.get("/dashboard/data").json()["policies"][0]["name"] == "per-ip"
