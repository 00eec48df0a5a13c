"""The service's logs: a level (``--log-level``, ``LOG_LEVEL``) and a format, ``text`` (one
line: time, level, message) or ``json`` (one object a line: ``time``, ``level``, ``logger``,
``msg``, and ``worker`` in a worker of ``--workers``), as envoyproxy/ratelimit's
``LOG_FORMAT=json`` gives a log shipper fields instead of text to parse.
"""

from __future__ import annotations

import json
import logging
import sys
import time

NAMES = ("ratekeeper", "uvicorn", "uvicorn.error")


class JsonFormatter(logging.Formatter):
    """One JSON object a record; ``tag`` (say ``worker 1``) goes in ``worker``."""

    def __init__(self, tag: str = "") -> None:
        super().__init__()
        self.tag = tag

    def format(self, record: logging.LogRecord) -> str:
        stamp = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created))
        out: dict[str, object] = {
            "time": f"{stamp}.{int(record.msecs):03d}Z",
            "level": record.levelname.lower(),
            "logger": record.name,
            "msg": record.getMessage(),
        }
        if self.tag:
            out["worker"] = self.tag
        if record.exc_info:
            out["error"] = self.formatException(record.exc_info)
        return json.dumps(out, ensure_ascii=False)


def configure(level: str, fmt: str, tag: str = "") -> None:
    """Log to stderr at ``level`` (a ``logging`` level name) in ``fmt`` (``text`` or
    ``json``); ``tag`` names the process (``worker 1``, ``supervisor``). Replaces the root
    logger's handlers, so a later ``logging.basicConfig`` changes nothing."""
    handler = logging.StreamHandler(sys.stderr)
    if fmt == "json":
        handler.setFormatter(JsonFormatter(tag))
    else:
        prefix = f"[{tag}] " if tag else ""
        handler.setFormatter(logging.Formatter(f"%(asctime)s %(levelname)s {prefix}%(message)s"))
    root = logging.getLogger()
    for old in list(root.handlers):
        root.removeHandler(old)
    root.addHandler(handler)
    root.setLevel(level)
    for name in NAMES:  # uvicorn's loggers keep their own level otherwise
        logging.getLogger(name).setLevel(level)
