"""Envoy's Rate Limit Quota Service (RLQS): Envoy's ``rate_limit_quota`` filter reports how
many requests each of its quota buckets saw, and enforces the token bucket it is assigned;
the service splits each bucket's global rate between the Envoys reporting it.

- the ``rlqs:`` config section (bucket ids -> policies, settings) is ``config.rlqs``;
- ``allocator``: the pure step that assigns a stream its share (``lua/allocate.lua``: its
  Redis twin); ``state``: where the records live (memory, Redis);
- ``hub``: streams, subscriptions, rebalancing, reloads and toggles (no wire);
- ``wire``: the gRPC stream and Envoy's messages. Its metrics and dashboard rows are
  ``service.rlqs_stats`` (beside the other faces' counters in ``service.metrics``).
"""
