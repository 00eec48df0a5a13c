"""The audit log of the admin operations: who changed what, when, and the state before and after.

Every admin operation (``quotas.admin``: reset, credit, debit, override, plan) writes one
``AuditEntry`` after it has been applied; a sink that fails is logged, never undoes the change.
Sinks (an ``Audit`` is anything with ``write(entry)``):

- ``LogAudit``: one JSON line per entry on the ``ratekeeper.audit`` logger (the default);
- ``FileAudit(path)``: JSON lines appended to a file, flushed per entry;
- ``RedisAudit(client, stream)``: ``XADD`` to a Redis stream, capped at ``maxlen`` entries
  (approximately, Redis' ``~``), shared by every process;
- ``MemoryAudit``: a list, for tests and the service's recent-changes view;
- ``Audits(a, b, ...)``: several at once.

``before`` and ``after`` are what ``status`` would show for the limit (used, remaining, reset),
read in the same atomic store call as the change.
"""

from __future__ import annotations

import json
import logging
import threading
from collections import deque
from collections.abc import Iterable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

log = logging.getLogger("ratekeeper")
audit_log = logging.getLogger("ratekeeper.audit")


@dataclass(frozen=True, slots=True)
class AuditEntry:
    """One admin change: ``action`` (reset, credit, debit, override, clear-override, plan) on
    ``tenant``'s ``limit`` (or the caller ``key`` for a rate outside the plans) by ``by`` at
    ``at`` (epoch seconds, the limiter's clock), with ``units`` and the state ``before`` and
    ``after`` (each a mapping, empty when not applicable)."""

    at: float
    by: str
    action: str
    key: str
    limit: str
    units: int = 0
    reason: str = ""
    before: dict[str, Any] = field(default_factory=dict)
    after: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), separators=(",", ":"), sort_keys=True, default=str)


@runtime_checkable
class Audit(Protocol):
    """A sink for audit entries."""

    def write(self, entry: AuditEntry) -> None:
        """Record ``entry``; may raise (the caller logs it and goes on)."""
        ...


class LogAudit:
    """Entries as JSON on the ``ratekeeper.audit`` logger at INFO."""

    def write(self, entry: AuditEntry) -> None:
        audit_log.info("%s", entry.to_json())


class FileAudit:
    """Entries appended to ``path`` as JSON lines (one line each, flushed)."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self._lock = threading.Lock()

    def write(self, entry: AuditEntry) -> None:
        line = entry.to_json() + "\n"
        with self._lock, self.path.open("a", encoding="utf-8") as f:
            f.write(line)
            f.flush()


class RedisAudit:
    """Entries ``XADD``-ed to ``stream`` (field ``entry``: the JSON), about ``maxlen`` kept."""

    def __init__(self, client: Any, stream: str = "ratekeeper:audit", maxlen: int = 100_000):
        self.client = client
        self.stream = stream
        self.maxlen = maxlen

    def write(self, entry: AuditEntry) -> None:
        self.client.xadd(
            self.stream, {"entry": entry.to_json()}, maxlen=self.maxlen, approximate=True
        )

    def recent(self, count: int = 100) -> list[AuditEntry]:
        """The latest ``count`` entries, newest first."""
        out = []
        for _id, fields in self.client.xrevrange(self.stream, count=count):
            raw = fields.get(b"entry") or fields.get("entry")
            out.append(AuditEntry(**json.loads(raw)))
        return out


class MemoryAudit:
    """The latest ``size`` entries in process, newest last."""

    def __init__(self, size: int = 1000) -> None:
        self.entries: deque[AuditEntry] = deque(maxlen=size)

    def write(self, entry: AuditEntry) -> None:
        self.entries.append(entry)


class Audits:
    """Several sinks: each gets every entry; one failing does not stop the others."""

    def __init__(self, *sinks: Audit) -> None:
        self.sinks: tuple[Audit, ...] = sinks

    def write(self, entry: AuditEntry) -> None:
        record(self.sinks, entry)


def record(sinks: Iterable[Audit], entry: AuditEntry) -> bool:
    """Write ``entry`` to every sink; False (and a log line) if any failed."""
    ok = True
    for sink in sinks:
        try:
            sink.write(entry)
        except Exception as exc:  # the change stands: say that its record is missing
            ok = False
            log.error(
                "ratekeeper could not write an audit entry to %r (%s): %s",
                sink,
                exc,
                entry.to_json(),
            )
    return ok
