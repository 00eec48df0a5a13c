"""Metrics of ratekeeper: one vocabulary, recorded in process, exported by optional adapters.

    from ratekeeper import Limiter
    from ratekeeper.metrics import Metrics
    from ratekeeper.metrics.prometheus import register    # needs prometheus-client

    metrics = Metrics()
    limiter = Limiter(metrics=metrics)
    register(metrics)                                     # onto prometheus_client's REGISTRY

- ``vocabulary``: every metric's name, kind, help, labels (``METRICS``);
- ``core``: ``Metrics``, the in-process recorder (no client library imported);
- ``topkeys``: ``SpaceSaving``, the bounded heavy-hitter sketch behind "top limited keys";
- ``prometheus`` / ``otel``: the adapters, each importing its client library when used.
"""

from .core import Metrics as Metrics
from .topkeys import SpaceSaving as SpaceSaving
from .vocabulary import METRICS as METRICS
from .vocabulary import OUTCOMES as OUTCOMES
from .vocabulary import MetricSpec as MetricSpec

__all__ = ["METRICS", "OUTCOMES", "MetricSpec", "Metrics", "SpaceSaving"]
