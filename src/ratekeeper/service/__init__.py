"""``ratekeeper serve``: the rate-limit service (needs the ``server`` extra).

One folder per face, the decision engine below them, the process above:

- ``http/``: the HTTP JSON API, its server and the dashboard;
- ``envoy/``: Envoy's protocols, ``ShouldRateLimit`` over gRPC and the quota service (``rlqs/``);
- ``config/``: the configuration language (ours and Envoy ratelimit's) -> ``ServiceConfig``;
- ``engine``: a parsed request -> a decision (named policies, Envoy descriptors, leases,
  the over-limit cache); ``metrics``: what every face counts (Prometheus; ``rlqs_stats``
  the quota service's buckets);
- the process: ``server`` (build the store, limiter and engine, serve HTTP and gRPC, reload),
  ``supervisor`` (``--workers``), ``lifecycle`` (signals, heartbeats), ``reloads``, ``logs``,
  ``statsd`` (upstream's statsd counters), ``auth`` (bearer tokens), and the subcommands
  ``cli``, ``check_config``, ``admin_cli`` and ``healthcheck`` (a probe of a running service).

This package's ``__init__`` imports nothing, so ``ratekeeper.service.cli`` can be imported
without the extra installed.
"""
