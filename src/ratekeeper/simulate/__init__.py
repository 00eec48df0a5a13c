"""``ratekeeper simulate``: enforcement on a replayed clock.

- ``logs``: combined / JSON lines / CSV logs (gzip, stdin) -> ``Entry``s;
- ``targets``: what decides — middleware checks through the WSGI middleware's gate, or the
  service's engine — over a ``MemoryStore`` and a ``ManualClock`` set from each line;
- ``stats``: per-limit counts fed by the targets' own ``metrics`` hook;
- ``suggest``: per-key need (peak usage as the algorithm counts it) and suggested limits;
- ``replay``: the driver and the ``Report``; ``render`` / ``html``: terminal and HTML output;
- ``cli``: the subcommand.
"""
