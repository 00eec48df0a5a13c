"""``Limiter`` and ``AsyncLimiter``: the public facade over one shared core.

What belongs here: the limiters themselves and the machinery every decision of theirs goes
through. ``core`` (``_Core``, ``_Base``: no I/O), ``sync`` (``Limiter``), ``asyncio``
(``AsyncLimiter``, ``Pending``) and ``nesting`` (``NestedCore``: nested calls and
reservations, built and answered for both faces). Their calls on plans (``"plan:<limit>"``,
``status``, ``administer``) are ``quotas.calls``' mixins.

``_Core`` holds everything that is not I/O — rate parsing and caching, plan building, the clock,
fail-open policy, the circuit breaker and counters. The two limiters differ only where ``await``
appears: ``store.execute(plan)`` versus ``await store.execute_async(plan)``.

Failure policy: a store error or timeout gives an allowed ``Decision`` with ``degraded=True``
(``fail_open=True``, the default) or raises ``StoreUnavailable``; a store that can decide
without its backend (``FailLocalStore``: ``LocalBudget(fail_local=True)``) answers first,
its decision marked ``degraded``. After ``breaker_threshold``
failures in a row the breaker opens and the store is not called for a cool-down that starts at
``breaker_cooldown`` seconds and doubles on each failed trial up to ``breaker_max_cooldown``;
the first call after the cool-down is the one trial, and its success closes the breaker (see
``breaker``). A ``Partitioned`` store (sharded Redis) gets one breaker per partition.

Two clocks: ``clock`` (epoch seconds) decides limits; ``monotonic`` (``time.monotonic``) times
the breaker's cool-downs and the failure log's interval, so a frozen or replayed rate clock
never freezes recovery. Tests inject each separately.

Plans (``quotas=``, a ``ratekeeper.quotas.Quotas``): a rate ``"plan:<limit>"`` is the key's
tenant's limit of that name (``quotas.cache``), decided like any rate; ``status(key)`` lists
a tenant's limits without charging, ``administer`` is an admin's atomic reset, credit or debit
(``quotas.admin`` adds the audit log).

Metrics (``metrics=``, a ``ratekeeper.metrics.Metrics``): each decision is counted under its
rates (``policy="100/1m"``) unless ``count_decisions=False`` (the middleware and the service
count under their own names), store calls are timed and their errors counted (the in-process
fast path makes no store call), and the breakers' states are watched. Off, it costs nothing.
"""

from .asyncio import AsyncLimiter as AsyncLimiter
from .asyncio import Pending as Pending
from .core import RateSpec as RateSpec
from .core import _Base as _Base
from .core import _Core as _Core
from .core import store_name as store_name
from .sync import Limiter as Limiter
