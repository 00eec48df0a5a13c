"""The one metric vocabulary of ratekeeper: every metric's name, kind, help, labels and unit.

The library (``Limiter``), the middleware and the service record into these metrics, and every
exporter (``metrics.prometheus``, ``metrics.otel``), the docs table, the Grafana dashboard and
the service's ``/metrics`` read their names from ``METRICS``. Names are Prometheus base names;
Prometheus adds ``_total`` to counters, OpenTelemetry uses the base name as is.

Label values are bounded: ``policy`` is a configured policy or check name (a library call is
labelled by its rates, e.g. ``100/1m``), ``outcome`` one of ``OUTCOMES``, ``store``/``shard``
/``kind`` come from the store configuration, ``shedder``/``tier`` from the shedder's settings,
``reason``, ``result``, ``function`` (``FUNCTIONS``) and ``event`` from fixed sets. As a safety
net every metric keeps at most ``max_series`` label sets; further ones are counted under the
label value ``_other``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

Kind = Literal["counter", "gauge", "histogram"]

OUTCOMES = ("allowed", "rejected", "local_rejected", "shadow_rejected", "degraded", "disabled")
"""Decision outcomes: ``local_rejected`` is answered by the service's over-limit cache,
``shadow_rejected`` would have been rejected by a check in shadow mode, ``degraded`` was
allowed without the store (fail open), ``disabled`` passed a check that is switched off."""

REJECTIONS = frozenset({"rejected", "local_rejected", "shadow_rejected"})
"""Outcomes that feed the top-limited-keys sketch."""

BREAKER_STATES = {"closed": 0, "failing": 1, "open": 2}
"""``ratekeeper_breaker_state`` values."""

LATENCY_BUCKETS = (0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.5)
BATCH_BUCKETS = (1.0, 2.0, 4.0, 8.0, 16.0, 32.0, 64.0, 128.0, 256.0)


@dataclass(frozen=True, slots=True)
class MetricSpec:
    """One metric: ``combine`` says how a gauge fed by several sources adds up (sum or max)."""

    name: str
    kind: Kind
    help: str
    labels: tuple[str, ...] = ()
    unit: str = ""
    buckets: tuple[float, ...] = ()
    combine: Literal["sum", "max"] = "sum"
    recorded_by: str = "library, middleware, service"

    @property
    def exposed(self) -> str:
        """The name Prometheus shows (counters get ``_total``)."""
        return self.name + "_total" if self.kind == "counter" else self.name


DECISIONS = MetricSpec(
    "ratekeeper_decisions", "counter", "Decisions by policy and outcome.",
    ("policy", "outcome"), "{decision}",
)  # fmt: skip
STORE_LATENCY = MetricSpec(
    "ratekeeper_store_latency_seconds", "histogram", "Latency of store calls.",
    unit="s", buckets=LATENCY_BUCKETS,
)  # fmt: skip
STORE_ERRORS = MetricSpec(
    "ratekeeper_store_errors", "counter", "Store calls that raised.", unit="{call}"
)
BREAKER_STATE = MetricSpec(
    "ratekeeper_breaker_state", "gauge",
    "Circuit breaker per store part: 0 closed, 1 failing, 2 open.",
    ("store", "shard", "kind"), combine="max",
)  # fmt: skip
IN_FLIGHT = MetricSpec(
    "ratekeeper_in_flight_requests", "gauge", "Requests in progress.", unit="{request}",
    recorded_by="middleware, service",
)  # fmt: skip
SHED_DROP = MetricSpec(
    "ratekeeper_shed_drop_probability", "gauge",
    "Worker-utilization shedder: chance a request of the tier is shed now.",
    ("shedder", "tier"), combine="max", recorded_by="middleware, any shedder watched",
)  # fmt: skip
BATCH_SIZE = MetricSpec(
    "ratekeeper_batch_size", "histogram", "Plans per store call.",
    unit="{plan}", buckets=BATCH_BUCKETS, recorded_by="service",
)  # fmt: skip
REFUSED = MetricSpec(
    "ratekeeper_requests_refused", "counter", "Requests refused before counting.",
    ("reason",), "{request}", recorded_by="service",
)  # fmt: skip
RELOADS = MetricSpec(
    "ratekeeper_config_reloads", "counter", "Config reloads by result.",
    ("result",), "{reload}", recorded_by="service",
)  # fmt: skip
POLICIES = MetricSpec("ratekeeper_policies", "gauge", "Policies loaded.", recorded_by="service")
USER_ERRORS = MetricSpec(
    "ratekeeper_user_function_errors", "counter",
    "Errors raised by the application's key, rate, cost, priority or charge functions.",
    ("policy", "function"), "{error}", recorded_by="middleware",
)  # fmt: skip

FUNCTIONS = ("key", "rate", "cost", "priority", "charge_when")
"""``ratekeeper_user_function_errors``'s ``function`` label: which of a check's functions raised."""

SLICES = MetricSpec(
    "ratekeeper_slices", "counter",
    "Slices of a key's budget a process took from the store or gave back (LocalBudget).",
    ("event",), "{slice}", recorded_by="LocalBudget",
)  # fmt: skip
SLICE_UNITS = MetricSpec(
    "ratekeeper_slice_units", "counter",
    "Units in slices: taken, given back, or expired unspent (LocalBudget).",
    ("event",), "{unit}", recorded_by="LocalBudget",
)  # fmt: skip
FALSE_REJECTIONS = MetricSpec(
    "ratekeeper_false_rejections", "counter",
    "Rejections while other processes' live slices held at least what the request lacked "
    "(an upper bound of rejections with budget left; LocalBudget).",
    unit="{decision}", recorded_by="LocalBudget",
)  # fmt: skip
FAIL_LOCAL = MetricSpec(
    "ratekeeper_fail_local_decisions", "counter",
    "Decisions made without the store at the process's share of the limit (LocalBudget).",
    ("outcome",), "{decision}", recorded_by="LocalBudget",
)  # fmt: skip

METRICS: tuple[MetricSpec, ...] = (
    DECISIONS, STORE_LATENCY, STORE_ERRORS, BREAKER_STATE, IN_FLIGHT, SHED_DROP,
    BATCH_SIZE, REFUSED, RELOADS, POLICIES, USER_ERRORS, SLICES, SLICE_UNITS, FALSE_REJECTIONS,
    FAIL_LOCAL,
)  # fmt: skip
"""Every metric ratekeeper records."""
