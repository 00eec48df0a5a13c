"""Overload protection: limits on work in progress and load shedding, decided from the state
of the system rather than from a caller's rate.

- ``concurrency``: ``ConcurrencyLimiter``, at most N requests in progress per key (leases in a
  store; Stripe's concurrent-requests limiter);
- ``shedding``: the fleet-usage shedder (leases of a fleet-wide capacity, reserved for critical
  traffic) and the worker-utilization shedder (priority tiers shed as a process saturates);
- ``signals``: where a Python server's overload shows (event-loop lag, process CPU, the queue
  delay a proxy's ``X-Request-Start`` tells), each as a utilization in [0, 1];
- ``admission``: at most ``limit`` requests in progress, the rest queued by priority and shed
  when they have waited too long; ``adaptive``: that limit found from latency
  (``GradientLimit``).

Per-caller rate limits are the limiter's (``ratekeeper.limiter``); the store circuit breaker
both use is ``ratekeeper.breaker``. The public names are offered by ``ratekeeper`` too.
"""

from .adaptive import GradientLimit as GradientLimit
from .adaptive import GradientSettings as GradientSettings
from .admission import AdmissionQueue as AdmissionQueue
from .admission import AsyncAdmissionQueue as AsyncAdmissionQueue
from .concurrency import AsyncConcurrencyLimiter as AsyncConcurrencyLimiter
from .concurrency import ConcurrencyLimiter as ConcurrencyLimiter
from .concurrency import Lease as Lease
from .shedding import AsyncFleetUsageShedder as AsyncFleetUsageShedder
from .shedding import FleetUsageShedder as FleetUsageShedder
from .shedding import ShedderSettings as ShedderSettings
from .shedding import WorkerUtilizationShedder as WorkerUtilizationShedder
from .signals import LoopLag as LoopLag
from .signals import Pressure as Pressure
from .signals import ProcessCPU as ProcessCPU
from .signals import QueueDelay as QueueDelay
