"""A statsd sink with envoyproxy/ratelimit's stat names, for dashboards built on upstream's.

Every ``interval`` seconds (upstream's ``STATS_FLUSH_INTERVAL``, 10 s by default) a thread
reads the service's own ``GET /metrics`` (so it counts every worker of ``--workers``, whose
metrics that route merges), takes each counter's increase since the last flush, and sends
the non-zero ones as statsd counters (``name:value|c``) over UDP, a few per datagram:

- ``ratekeeper_envoy_<stat>_total{domain, key}`` ->
  ``ratelimit.service.rate_limit.<domain>.<key>.<stat>`` (``total_hits``, ``over_limit``,
  ``near_limit``, ``within_limit``, ``shadow_mode``, ``over_limit_with_local_cache``);
- ``ratekeeper_envoy_domain_not_found_total{domain}`` ->
  ``ratelimit.service.rate_limit.<domain>.domain_not_found``;
- ``ratekeeper_envoy_global_shadow_mode_total`` -> ``ratelimit.service.global_shadow_mode``;
- ``ratekeeper_config_reloads_total{result}`` -> ``ratelimit.service.config_load_success`` /
  ``config_load_error``;
- ``ratekeeper_store_errors_total`` -> ``ratelimit.service.call.should_rate_limit.redis_error``.

The sink starts with the process, so its first flush sends the counters' whole values (what
they counted since the service started), as upstream's counters do. A lost datagram is lost,
as with any statsd client; a failed scrape is logged once per outage and retried at the next
flush.
"""

from __future__ import annotations

import logging
import socket
import threading
import urllib.request
from collections.abc import Callable, Iterable

from prometheus_client.parser import text_string_to_metric_families

log = logging.getLogger("ratekeeper.service")

PREFIX = "ratelimit.service"
MAX_DATAGRAM = 1400  # bytes: under a typical MTU, as statsd clients keep them

_ENVOY = "ratekeeper_envoy_"


def stat_name(sample: str, labels: dict[str, str]) -> str | None:
    """Upstream's statsd name of one Prometheus sample (``..._total``), or None for a
    series upstream has no stat for."""
    if sample == "ratekeeper_envoy_domain_not_found_total":
        return f"{PREFIX}.rate_limit.{labels.get('domain', '')}.domain_not_found"
    if sample == "ratekeeper_envoy_global_shadow_mode_total":
        return f"{PREFIX}.global_shadow_mode"
    if sample.startswith(_ENVOY) and sample.endswith("_total") and "key" in labels:
        stat = sample[len(_ENVOY) : -len("_total")]
        return f"{PREFIX}.rate_limit.{labels.get('domain', '')}.{labels['key']}.{stat}"
    if sample == "ratekeeper_config_reloads_total":
        result = {"ok": "config_load_success", "error": "config_load_error"}
        return f"{PREFIX}.{result[labels['result']]}" if labels.get("result") in result else None
    if sample == "ratekeeper_store_errors_total":
        return f"{PREFIX}.call.should_rate_limit.redis_error"
    return None


def counters(exposition: str) -> dict[str, float]:
    """Upstream's stat name -> its total, from a Prometheus text exposition."""
    out: dict[str, float] = {}
    for family in text_string_to_metric_families(exposition):
        if family.type != "counter":
            continue
        for sample in family.samples:
            name = stat_name(sample.name, sample.labels)
            if name is not None:
                out[name] = out.get(name, 0.0) + sample.value
    return out


def datagrams(increases: Iterable[tuple[str, int]]) -> list[bytes]:
    """``name:value|c`` lines packed into datagrams of at most ``MAX_DATAGRAM`` bytes."""
    out: list[bytes] = []
    current = b""
    for name, value in increases:
        line = f"{name}:{value}|c".encode()
        if current and len(current) + 1 + len(line) > MAX_DATAGRAM:
            out.append(current)
            current = b""
        current = line if not current else current + b"\n" + line
    if current:
        out.append(current)
    return out


class StatsdSink:
    """Scrapes ``metrics_url`` every ``interval`` seconds and sends the increases to
    ``address`` (``host:port``). ``start`` runs it on a daemon thread; ``stop`` ends it."""

    def __init__(
        self,
        metrics_url: str,
        address: str,
        interval: float,
        fetch: Callable[[str], str] | None = None,
    ) -> None:
        host, _, port = address.rpartition(":")
        self.target = (host, int(port))
        self.url = metrics_url
        self.interval = interval
        self.fetch = fetch or _fetch
        self.last: dict[str, float] = {}
        self.sent = 0
        self.failing = False
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._socket = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)

    def flush(self) -> int:
        """One scrape and send; the number of stats sent."""
        try:
            now = counters(self.fetch(self.url))
        except (OSError, ValueError) as exc:
            if not self.failing:
                log.warning("statsd: cannot read %s: %s; retrying every flush", self.url, exc)
            self.failing = True
            return 0
        if self.failing:
            log.info("statsd: %s answers again", self.url)
        self.failing = False
        previous, self.last = self.last, now
        increases = [
            (name, int(value - previous.get(name, 0.0)))
            for name, value in sorted(now.items())
            if value - previous.get(name, 0.0) >= 1
        ]
        for datagram in datagrams(increases):
            try:
                self._socket.sendto(datagram, self.target)
            except OSError as exc:  # statsd is best effort: a lost flush is logged, not fatal
                log.warning("statsd: cannot send to %s:%s: %s", *self.target, exc)
                break
        self.sent += len(increases)
        return len(increases)

    def start(self) -> None:
        """Flush every ``interval`` seconds on a daemon thread."""
        self._thread = threading.Thread(target=self._run, name="ratekeeper-statsd", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            self.flush()

    def stop(self) -> None:
        """Stop the thread (the service is stopping: there is nothing left to scrape)."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
        self._socket.close()


def _fetch(url: str) -> str:
    with urllib.request.urlopen(url, timeout=5) as response:
        body: bytes = response.read()
    return body.decode("utf-8")
