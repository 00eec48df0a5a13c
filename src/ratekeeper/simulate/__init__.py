"""``ratekeeper simulate``: enforcement on a replayed clock.

- ``reading/``: files -> entries in time order (lines, timestamps, formats, the reorder
  buffer over the skew window, or every line sorted);
- ``targets``: what decides — middleware checks through the WSGI middleware's gate, the
  service's engine, or candidate limits through ``Limiter.hit``'s store call — over a
  ``MemoryStore`` and a ``ManualClock`` set from each line;
- ``stats``: per-limit counts fed by the targets' own ``metrics`` hook;
- ``suggest``: per-key need (peak usage as the algorithm counts it, refunds included);
  ``advice``: the suggestions and what each would do;
- ``replay``: the driver; ``output/``: what it found, as data (``report``), terminal and
  HTML output;
- ``cli``: the subcommand.
"""
