"""Reading logs: files -> entries in time order, in bounded memory.

- ``lines``: files (gzip, stdin) -> blocks of whole lines, overlong lines dropped as they
  stream; ``times``: timestamps in any zone or epoch unit -> epoch seconds;
- ``formats`` (W3C/IIS/CloudFront, ALB, CSV, detection from a sample), ``jsonlog`` (JSON
  lines, dotted paths, server presets), ``combined`` (the common log format family, a block
  of lines per ``findall``); ``logs``: one stream -> ``Entry``s, or runs of one time and one
  field;
- ``order``: a reorder buffer per file over the skew window, files merged by time; when a
  line is further behind, every line sorted (``sort``: an external merge sort over
  temporary runs), the logs read again from their start (``sources``: standard input and
  pipes from a copy made as they were read).
"""
