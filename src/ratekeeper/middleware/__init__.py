"""ASGI and WSGI middleware putting ratekeeper's limiters and shedders in front of an API.

    from ratekeeper.middleware import RateLimitMiddleware, RateCheck, keys
    app.add_middleware(RateLimitMiddleware, checks=[RateCheck("api", "10/second; 500/hour")],
                       trusted_proxies=["10.0.0.0/8"])  # behind load balancers: set them once

What belongs where:

- ``checks``: the check configurations and ``Controls`` (modes, counters, Redis flags);
- ``costs``: what a settling check charges once the response has ended (a response header,
  the app's reported cost, body bytes), and ``report`` for the app to say it;
- ``request``: ``RequestInfo`` from a scope or environ, key functions, priorities, path matching
  (also importable as ``ratekeeper.middleware.keys``);
- ``responses``: rejection bodies and headers, pure;
- ``gate``: the admission rules, written once as generators of store operations (``ops``);
  ``nested_checks``: a ``NestedCheck``'s step and how reservations end;
- ``runner``: those operations carried out on sync or async limiters (``Runner``,
  ``AsyncRunner``), for the middleware and the framework integrations;
- ``asgi`` / ``wsgi``: the two middleware, a screenful of I/O each.

No web framework is imported here or anywhere in ratekeeper's middleware.
"""

from . import costs as costs
from . import request as keys
from .asgi import RateLimitMiddleware as RateLimitMiddleware
from .checks import AdmissionCheck as AdmissionCheck
from .checks import CheckLevel as CheckLevel
from .checks import ConcurrencyCheck as ConcurrencyCheck
from .checks import Controls as Controls
from .checks import FleetCheck as FleetCheck
from .checks import NestedCheck as NestedCheck
from .checks import RateCheck as RateCheck
from .checks import WorkerCheck as WorkerCheck
from .checks import redis_flags as redis_flags
from .request import RequestInfo as RequestInfo
from .request import priorities as priorities
from .responses import Rejection as Rejection
from .wsgi import WSGIRateLimitMiddleware as WSGIRateLimitMiddleware

__all__ = [
    "AdmissionCheck",
    "CheckLevel",
    "ConcurrencyCheck",
    "Controls",
    "FleetCheck",
    "NestedCheck",
    "RateCheck",
    "RateLimitMiddleware",
    "Rejection",
    "RequestInfo",
    "WSGIRateLimitMiddleware",
    "WorkerCheck",
    "costs",
    "keys",
    "priorities",
    "redis_flags",
]
