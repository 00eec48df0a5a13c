"""The quota service's metrics: Prometheus families made at scrape time from the live
buckets (``Quotas.rows``) and a few counters, and the rows the dashboard shows.

Label values from Envoy (bucket ids, domains) are bounded: the first ``MAX_LABELS`` distinct
buckets (and domains) keep a label of their own, later ones count under ``<other>``.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass

from prometheus_client import CollectorRegistry
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

MAX_LABELS = 100
OTHER = "<other>"
ACTIONS = ("token_bucket", "allow_all", "deny_all", "abandon")
REFUSALS = ("bucket_id", "max_buckets", "report")


@dataclass(frozen=True, slots=True)
class Row:
    """One bucket as this process sees it."""

    bucket: str
    """Its label (``domain/key=value,...``, or ``<other>``)."""
    policy: str
    mode: str
    """``quota``, ``allow_all`` (shadow or off), ``deny_all`` (block), ``unmatched``."""
    limit: float
    """The global rate, requests a second."""
    assigned: float
    """The rates assigned to this process's streams, summed."""
    allowed: float
    denied: float
    """Requests a second this process's streams last reported."""
    envoys: int
    """Fresh streams of the bucket across the fleet (the shared view)."""
    streams: int
    """This process's streams reporting it."""


class RlqsStats:
    """Counters kept here; gauges read from ``source`` (the live buckets) when scraped."""

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self._lock = threading.Lock()
        self.source: Callable[[], list[Row]] = list
        self.streams: Callable[[], int] = lambda: 0
        self.labels: dict[str, str] = {}
        self.reports = 0
        self.usages = 0
        self.actions = dict.fromkeys(ACTIONS, 0)
        self.refused = dict.fromkeys(REFUSALS, 0)
        self.requests: dict[tuple[str, str], int] = {}
        self.unmatched: dict[str, int] = {}
        if registry is not None:
            registry.register(self)

    def label(self, bucket: str) -> str:
        """The ``bucket`` label of a bucket key's text (bounded)."""
        found = self.labels.get(bucket)
        if found is None:
            found = bucket if len(self.labels) < MAX_LABELS else OTHER
            if found != OTHER:
                self.labels[bucket] = found
        return found

    def reported(self, label: str, allowed: int, denied: int) -> None:
        with self._lock:
            for outcome, n in (("allowed", allowed), ("denied", denied)):
                self.requests[(label, outcome)] = self.requests.get((label, outcome), 0) + n

    def count_unmatched(self, domain: str) -> None:
        with self._lock:
            if domain not in self.unmatched and len(self.unmatched) >= MAX_LABELS:
                domain = OTHER
            self.unmatched[domain] = self.unmatched.get(domain, 0) + 1

    def sent(self, action: str) -> None:
        self.actions[action] += 1

    def refuse(self, reason: str) -> None:
        self.refused[reason] += 1

    def rows(self) -> list[Row]:
        """The live buckets, rows of one label summed (``<other>``)."""
        merged: dict[str, Row] = {}
        for row in self.source():
            have = merged.get(row.bucket)
            if have is None:
                merged[row.bucket] = row
            else:
                merged[row.bucket] = Row(
                    row.bucket, "", "", have.limit + row.limit, have.assigned + row.assigned,
                    have.allowed + row.allowed, have.denied + row.denied,
                    have.envoys + row.envoys, have.streams + row.streams,
                )  # fmt: skip
        return [merged[k] for k in sorted(merged)]

    def collect(self) -> Iterator[Metric]:
        """The ``ratekeeper_rlqs_*`` families."""
        rows = self.rows()
        gauges = (
            ("limit_rate", "The bucket's global rate (requests/s).", "limit"),
            ("assigned_rate", "Rates assigned to this process's Envoy streams (requests/s).",
             "assigned"),
            ("envoys", "Envoy streams reporting the bucket across the fleet.", "envoys"),
            ("streams", "This process's Envoy streams reporting the bucket.", "streams"),
        )  # fmt: skip
        for name, doc, attr in gauges:
            gauge = GaugeMetricFamily(f"ratekeeper_rlqs_{name}", doc, labels=["bucket", "policy"])
            for row in rows:
                gauge.add_metric([row.bucket, row.policy], float(getattr(row, attr)))
            yield gauge
        usage = GaugeMetricFamily(
            "ratekeeper_rlqs_usage_rate", "Requests/s the streams last reported, by outcome.",
            labels=["bucket", "outcome"],
        )  # fmt: skip
        for row in rows:
            usage.add_metric([row.bucket, "allowed"], row.allowed)
            usage.add_metric([row.bucket, "denied"], row.denied)
        yield usage
        with self._lock:
            requests = list(self.requests.items())
            unmatched = list(self.unmatched.items())
        family = CounterMetricFamily(
            "ratekeeper_rlqs_requests", "Requests Envoy reported, by outcome.",
            labels=["bucket", "outcome"],
        )  # fmt: skip
        for (label, outcome), n in requests:
            family.add_metric([label, outcome], n)
        yield family
        yield CounterMetricFamily(
            "ratekeeper_rlqs_reports", "Usage reports received.", value=self.reports
        )
        yield CounterMetricFamily(
            "ratekeeper_rlqs_bucket_reports",
            "Buckets in the usage reports received (one per bucket and report).",
            value=self.usages,
        )
        family = CounterMetricFamily(
            "ratekeeper_rlqs_actions", "Bucket actions sent, by kind.", labels=["action"]
        )
        for action, n in self.actions.items():
            family.add_metric([action], n)
        yield family
        family = CounterMetricFamily(
            "ratekeeper_rlqs_refused", "Bucket reports not served, by reason.", labels=["reason"]
        )
        for reason, n in self.refused.items():
            family.add_metric([reason], n)
        yield family
        family = CounterMetricFamily(
            "ratekeeper_rlqs_unmatched", "Buckets no rule matches, by domain.", labels=["domain"]
        )
        for domain, n in unmatched:
            family.add_metric([domain], n)
        yield family
        yield GaugeMetricFamily(
            "ratekeeper_rlqs_open_streams", "Envoy streams open.", value=self.streams()
        )
