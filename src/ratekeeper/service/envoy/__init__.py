"""The service's Envoy face: Envoy's rate limit protocols over gRPC.

- ``rls``: ``ShouldRateLimit`` answered as envoyproxy/ratelimit answers it (no wire format);
  ``match``: one descriptor against a domain's tree;
- ``servicer``: the gRPC servicer (Envoy's messages, bearer tokens, threads);
  ``reply``: ``RateLimitResponse`` bytes encoded directly;
- ``rlqs/``: Envoy's Rate Limit Quota Service (streams, allocation, state).

The Envoy config format is read in ``service.config.envoy``. Imports nothing.
"""
