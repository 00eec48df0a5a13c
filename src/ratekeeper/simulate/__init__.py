"""``ratekeeper simulate``: enforcement on a replayed clock.

- ``logs``: combined / JSON lines / CSV logs (gzip, stdin) -> ``Entry``s, or runs of one
  time and one field; ``combined``: the combined format's pattern, run over blocks of lines;
- ``targets``: what decides — middleware checks through the WSGI middleware's gate, the
  service's engine, or candidate limits through ``Limiter.hit``'s store call — over a
  ``MemoryStore`` and a ``ManualClock`` set from each line;
- ``stats``: per-limit counts fed by the targets' own ``metrics`` hook;
- ``suggest``: per-key need (peak usage as the algorithm counts it) and suggested limits;
- ``replay``: the driver and the ``Report``; ``render`` / ``html``: terminal and HTML output;
- ``cli``: the subcommand.
"""
