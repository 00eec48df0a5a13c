"""``ratekeeper simulate``: enforcement on a replayed clock.

- ``lines``: files (gzip, stdin) -> blocks of whole lines, overlong lines dropped as they
  stream; ``times``: timestamps in any zone or epoch unit -> epoch seconds;
- ``formats`` (W3C/IIS/CloudFront, ALB, CSV, detection from a sample), ``jsonlog`` (JSON
  lines, dotted paths, server presets), ``combined`` (the common log format family, a block
  of lines per ``findall``); ``logs``: one stream -> ``Entry``s, or runs of one time and one
  field;
- ``order``: a reorder buffer per file over the skew window, files merged by time;
- ``targets``: what decides — middleware checks through the WSGI middleware's gate, the
  service's engine, or candidate limits through ``Limiter.hit``'s store call — over a
  ``MemoryStore`` and a ``ManualClock`` set from each line;
- ``stats``: per-limit counts fed by the targets' own ``metrics`` hook;
- ``suggest``: per-key need (peak usage as the algorithm counts it, refunds included);
  ``advice``: the suggestions and what each would do;
- ``replay``: the driver; ``report``: what it found, as data; ``render`` / ``charts`` /
  ``html``: terminal and HTML output;
- ``cli``: the subcommand.
"""
