"""The running service's plans: the ``Quotas`` its limiter resolves ``plan:<limit>`` with,
rebuilt when a reload changes the ``quotas:`` section or the plans file, and the admin tools
(``AsyncAdmin``) with their audit log.

The audit log of the admin API goes to the ``ratekeeper.audit`` logger, to the last 1000 entries
kept in process (``GET /v1/admin/quotas/audit``), and to ``audit_file`` / ``audit_stream``
when configured. A config without ``quotas:`` leaves the limiter without plans: nothing here
runs on a decision then.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from ...errors import ConfigError
from ...limiter import AsyncLimiter
from ...quotas import (
    AsyncAdmin,
    Audit,
    AuditEntry,
    Audits,
    FileAudit,
    LogAudit,
    MemoryAudit,
    Quotas,
    RedisAudit,
    RedisSource,
)
from ..config.quotas import QuotaSettings

log = logging.getLogger("ratekeeper.service")
RECENT = 1000
"""Audit entries kept in process for ``GET /v1/admin/quotas/audit``."""


class PlanService:
    """The plans of one service process (module docstring)."""

    def __init__(self, limiter: AsyncLimiter) -> None:
        self.limiter = limiter
        self.settings: QuotaSettings | None = None
        self.quotas: Quotas | None = None
        self.admin: AsyncAdmin | None = None
        self.recent = MemoryAudit(RECENT)
        self.stream: RedisAudit | None = None

    def apply(self, settings: QuotaSettings | None) -> None:
        """Use ``settings`` (a reload's): the same section and plans file keep the running
        ``Quotas`` (and its cache); anything else builds new ones."""
        if settings == self.settings and (settings is None or self.quotas is not None):
            return
        old = self.quotas
        self.quotas = None if settings is None else build_quotas(settings, self.recent)
        self.stream = None
        if self.quotas is not None and settings is not None and settings.audit_stream:
            source = self.quotas.source
            assert isinstance(source, RedisSource)
            self.stream = RedisAudit(source.client, settings.audit_stream)
        self.limiter._plans(self.quotas)
        self.admin = None if self.quotas is None else AsyncAdmin(self.limiter)
        self.settings = settings
        if old is not None:
            old.close()

    @property
    def writable(self) -> bool:
        """Whether overrides and plan changes can be made here: with ``source: file`` they
        would live in one process and be lost at the next reload (the plans file is the truth)."""
        return self.settings is not None and self.settings.source == "redis"

    def entries(self, count: int) -> list[AuditEntry]:
        """The latest ``count`` audit entries, newest first: the shared stream's when
        configured, else this process's."""
        if self.stream is not None:
            return self.stream.recent(count)
        return list(reversed(self.recent.entries))[:count]

    def close(self) -> None:
        """Stop listening for plan changes."""
        if self.quotas is not None:
            self.quotas.close()


def build_quotas(settings: QuotaSettings, recent: MemoryAudit) -> Quotas:
    """``Quotas`` for ``settings``, writing audit entries to ``recent`` and the configured sinks."""
    source = None
    if settings.source == "redis":
        source = RedisSource(settings.url, prefix=settings.prefix)
    sinks: list[Audit] = [recent, LogAudit()]
    if settings.audit_file:
        sinks.append(FileAudit(settings.audit_file))
    if settings.audit_stream:
        assert source is not None  # config.quotas refuses audit_stream without source: redis
        sinks.append(RedisAudit(source.client, settings.audit_stream))
    tenant: Callable[[str], str] | None = None
    separator = settings.tenant_separator
    if separator:

        def tenant(key: str) -> str:
            return key.split(separator, 1)[0] or key

    try:
        return Quotas(
            settings.plans, source, ttl=settings.ttl, retry=settings.retry, tenant=tenant,
            on_error=settings.on_error, audit=Audits(*sinks),
        )  # fmt: skip
    except ConfigError:
        raise
    except Exception as exc:  # a Redis client that cannot be made from the url
        raise ConfigError(f"quotas: cannot use the plan source: {exc}") from exc


def describe(settings: QuotaSettings | None) -> dict[str, Any] | None:
    """What ``/v1/status`` says about the plans' setup."""
    if settings is None:
        return None
    return {"source": settings.source, "ttl": settings.ttl, "default": settings.plans.default}
