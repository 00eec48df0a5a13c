"""Export ``Metrics`` to Prometheus through prometheus-client (the ``prometheus`` extra).

``register(metrics, registry)`` adds one collector that reads the recorded values at every
scrape; nothing is copied on the hot path. The names are the vocabulary's (counters gain
``_total``); ``ratekeeper serve``'s ``/metrics`` is this collector on a private registry.
"""

from __future__ import annotations

from collections.abc import Iterator

from prometheus_client import REGISTRY, CollectorRegistry
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)
from prometheus_client.registry import Collector

from .core import Metrics


class MetricsCollector(Collector):
    """A prometheus-client collector over one ``Metrics``."""

    def __init__(self, metrics: Metrics) -> None:
        self.metrics = metrics

    def collect(self) -> Iterator[Metric]:
        for family in self.metrics.families.values():
            spec = family.spec
            labels = list(spec.labels)
            if spec.kind == "histogram":
                h = HistogramMetricFamily(spec.name, spec.help, labels=labels)
                bounds = [*(_bound(b) for b in spec.buckets), "+Inf"]
                for values, cumulative, total in family.histograms():
                    h.add_metric(list(values), list(zip(bounds, cumulative, strict=True)), total)
                yield h
                continue
            cls = CounterMetricFamily if spec.kind == "counter" else GaugeMetricFamily
            m = cls(spec.name, spec.help, labels=labels)
            for values, value in family.samples():
                m.add_metric(list(values), value)
            yield m

    def describe(self) -> Iterator[Metric]:
        """The families without samples, so a registry can check names for clashes."""
        for family in self.metrics.families.values():
            spec = family.spec
            kinds = {
                "counter": CounterMetricFamily,
                "gauge": GaugeMetricFamily,
                "histogram": HistogramMetricFamily,
            }
            yield kinds[spec.kind](spec.name, spec.help, labels=list(spec.labels))


def _bound(value: float) -> str:
    return repr(float(value))


def register(metrics: Metrics, registry: CollectorRegistry = REGISTRY) -> MetricsCollector:
    """Export ``metrics`` on ``registry`` (default: prometheus-client's global one)."""
    collector = MetricsCollector(metrics)
    registry.register(collector)
    return collector
