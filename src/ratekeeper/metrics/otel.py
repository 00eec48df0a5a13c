"""Export ``Metrics`` through OpenTelemetry's metrics API (the ``otel`` extra).

``instrument(metrics, meter_provider)`` creates one instrument per metric of the vocabulary,
under the same names: counters and gauges are *observable* (read at each collection, nothing
on the hot path), and each histogram is a synchronous OTel histogram fed by a listener on the
recorded one (observations from the moment it is instrumented). Only the API package is
needed; the SDK and exporters are the application's choice.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from opentelemetry import metrics as otel
from opentelemetry.metrics import CallbackOptions, Meter, MeterProvider, Observation

from .._version import __version__
from .core import Family, Labels, Metrics


def instrument(metrics: Metrics, meter_provider: MeterProvider | None = None) -> Meter:
    """Create the instruments on ``meter_provider`` (default: the global one)."""
    meter = otel.get_meter("ratekeeper", __version__, meter_provider=meter_provider)
    for family in metrics.families.values():
        spec = family.spec
        if spec.kind == "histogram":
            hist = meter.create_histogram(
                spec.name,
                unit=spec.unit,
                description=spec.help,
                explicit_bucket_boundaries_advisory=list(spec.buckets),
            )
            family.listeners.append(_recorder(hist, spec.labels))
        elif spec.kind == "counter":
            meter.create_observable_counter(
                spec.name, [_observer(family)], unit=spec.unit, description=spec.help
            )
        else:
            meter.create_observable_gauge(
                spec.name, [_observer(family)], unit=spec.unit, description=spec.help
            )
    return meter


def _observer(family: Family) -> Any:
    names = family.spec.labels

    def observe(options: CallbackOptions) -> Iterable[Observation]:
        return [
            Observation(value, dict(zip(names, labels, strict=True)))
            for labels, value in family.samples()
        ]

    return observe


def _recorder(hist: Any, names: tuple[str, ...]) -> Any:
    def record(value: float, labels: Labels) -> None:
        hist.record(value, dict(zip(names, labels, strict=True)) if names else None)

    return record
