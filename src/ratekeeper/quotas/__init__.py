"""Quotas for API businesses: per-customer limits from plans, with overrides, status and admin.

- ``Plans`` (``catalog``): the plans you sell, each a set of named limits (``PlanLimit``),
  read from YAML (``Plans.load``) or a dict, checked at load with ``file:line`` problems.
- Sources (``sources``): which plan a tenant is on and its overrides — ``StaticSource`` (in
  process, the plans file's ``customers``), ``RedisSource`` (shared, with change
  notifications), ``FunctionSource`` (your database lookup).
- ``Quotas`` (``cache``): plans + a source + the in-process cache with a TTL; give it to a
  limiter (``Limiter(store, quotas=quotas)``) and use ``"plan:<limit>"`` as the rate.
- ``Limiter.status(key)`` (``status.QuotaStatus``): every limit of a caller, charging nothing.
- ``Admin`` / ``AsyncAdmin`` (``admin``): reset, credit, debit, overrides and plan changes,
  each written to the audit log (``audit``: ``LogAudit``, ``FileAudit``, ``RedisAudit``,
  ``MemoryAudit``).

Calendar periods (``1000/calendar-month``) are ``ratekeeper.calendar``; the counters of a
limit are named by the limit and its window, never its rate (``plan.make_policy``), so plan
changes and overrides keep what a tenant has used. The guide: docs/quotas.md.
"""

from .admin import Adjustment as Adjustment
from .admin import Admin as Admin
from .admin import AsyncAdmin as AsyncAdmin
from .audit import Audit as Audit
from .audit import AuditEntry as AuditEntry
from .audit import Audits as Audits
from .audit import FileAudit as FileAudit
from .audit import LogAudit as LogAudit
from .audit import MemoryAudit as MemoryAudit
from .audit import RedisAudit as RedisAudit
from .cache import Quotas as Quotas
from .catalog import PlanLimit as PlanLimit
from .catalog import Plans as Plans
from .overrides import Override as Override
from .overrides import TenantPlan as TenantPlan
from .sources import FunctionSource as FunctionSource
from .sources import RedisSource as RedisSource
from .sources import StaticSource as StaticSource
from .status import QuotaStatus as QuotaStatus

__all__ = [
    "Adjustment",
    "Admin",
    "AsyncAdmin",
    "Audit",
    "AuditEntry",
    "Audits",
    "FileAudit",
    "FunctionSource",
    "LogAudit",
    "MemoryAudit",
    "Override",
    "PlanLimit",
    "Plans",
    "QuotaStatus",
    "Quotas",
    "RedisAudit",
    "RedisSource",
    "StaticSource",
    "TenantPlan",
]
