"""The service's decision engine: a parsed request -> a result, whatever face asked.

- ``core``: ``Engine``: named policies (hit, peek, refund, reset), leases of concurrency
  policies, runtime toggles, and the fast paths (``answer_now``) a protocol calls first;
- ``fast``: the fast hit on an in-process store (an admitted hit as the store's outcome);
- ``nested``: Envoy descriptors decided as one nested call (``envoy.nested_domains``);
- ``quotas``: tenants' plans served (``PlanService``); ``cache``: the over-limit cache;
  ``keys``: store keys and lease tokens;
- ``results``: what it answers (``Result``, ``LeaseResult``).

The protocols (``service.http``, ``service.envoy``) parse and render; they ask the engine.
"""

from ...limiter import Pending as Pending
from .cache import OverLimitCache as OverLimitCache
from .core import Engine as Engine
from .keys import envoy_key as envoy_key
from .keys import lease_token as lease_token
from .keys import parse_lease_token as parse_lease_token
from .keys import store_key as store_key
from .results import LeaseResult as LeaseResult
from .results import Result as Result
