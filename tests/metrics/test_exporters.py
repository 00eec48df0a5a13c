"""The adapters: Prometheus text and OpenTelemetry instruments carry the same names and values."""

from __future__ import annotations

from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from ratekeeper import Limiter, ManualClock
from ratekeeper.metrics import METRICS, Metrics
from ratekeeper.metrics.otel import instrument
from ratekeeper.metrics.prometheus import register


def traffic(m: Metrics) -> Limiter:
    limiter = Limiter(clock=ManualClock(), metrics=m)
    for _ in range(5):
        limiter.hit("k", "3/minute")
    limiter.hit("k", "1/second; 9/minute")
    m.batch_size.observe(4)
    return limiter  # alive: its breakers are exported while it lives


def test_prometheus_exposes_every_metric_of_the_vocabulary() -> None:
    m = Metrics()
    registry = CollectorRegistry()
    register(m, registry)
    limiter = traffic(m)
    text = generate_latest(registry).decode()
    families = {f.name: f for f in text_string_to_metric_families(text)}
    for spec in METRICS:
        assert spec.name.removesuffix("_total") in families or spec.name in families, spec.name
    values = {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for f in families.values()
        for s in f.samples
    }
    key = ("ratekeeper_decisions_total", (("outcome", "rejected"), ("policy", "3/1m")))
    assert values[key] == 2
    assert 'ratekeeper_breaker_state{kind="rate",shard="0",store="memory"} 0.0' in text
    assert 'ratekeeper_batch_size_bucket{le="4.0"} 1.0' in text
    assert limiter.breaker_states() == {"0": "closed"}


def test_opentelemetry_reads_the_same_values_under_the_same_names() -> None:
    m = Metrics()
    reader = InMemoryMetricReader()
    provider = MeterProvider(metric_readers=[reader])
    instrument(m, provider)
    limiter = traffic(m)
    data = reader.get_metrics_data()
    points: dict[str, list[object]] = {}
    for rm in data.resource_metrics:
        for sm in rm.scope_metrics:
            for metric in sm.metrics:
                points[metric.name] = list(metric.data.data_points)
    assert {"ratekeeper_decisions", "ratekeeper_store_latency_seconds"} <= set(points)
    by_labels = {
        tuple(sorted(p.attributes.items())): p.value  # type: ignore[attr-defined]
        for p in points["ratekeeper_decisions"]
    }
    assert by_labels[(("outcome", "allowed"), ("policy", "3/1m"))] == 3
    assert by_labels[(("outcome", "rejected"), ("policy", "3/1m"))] == 2
    [hist] = points["ratekeeper_store_latency_seconds"]
    assert hist.count == 2  # type: ignore[attr-defined]  # first use of a policy, and the stack
    [batch] = points["ratekeeper_batch_size"]
    assert batch.sum == 4  # type: ignore[attr-defined]
    assert {"ratekeeper_breaker_state", "ratekeeper_in_flight_requests"} <= set(points)
    assert limiter.breaker_states() == {"0": "closed"}
