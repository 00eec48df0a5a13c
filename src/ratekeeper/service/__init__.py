"""``ratekeeper serve``: the rate-limit service (needs the ``server`` extra).

- ``config``: YAML config files (ours and Envoy ratelimit's) -> ``ServiceConfig``;
- ``engine``: named policies and Envoy descriptors -> decisions, over-limit cache;
- ``http``: the HTTP JSON API (ASGI); ``grpc_rls``: Envoy's ShouldRateLimit;
- ``metrics``: Prometheus; ``server``: running it all (Redis stores batch concurrent calls:
  ``stores.batching``), reloads; ``cli``: the subcommand.

This package's ``__init__`` imports nothing, so ``ratekeeper.service.cli`` can be imported
without the extra installed.
"""
