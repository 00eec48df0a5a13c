"""Framework integrations: thin shells over the middleware's gate.

- ``fastapi``: ``RouteLimits`` for FastAPI and Starlette — ``@limit``, ``shared_limit``,
  ``@exempt``, a dependency, default limits, ``RateLimited`` for the 429's exception handler;
- ``flask``: the ``RouteLimits`` extension — ``init_app``, ``RATELIMIT_*`` settings,
  ``@limit``/``@exempt`` on views and blueprints;
- ``django``: ``RateLimitMiddleware`` for ``MIDDLEWARE`` (settings in ``RATEKEEPER``), the
  ``@ratelimit`` view decorator and ``@exempt``;
- ``drf``: throttle classes for Django REST framework.

Shared here, written once: ``routes`` (limits as data; which checks a route walks) and
``settings`` (reading a framework's configuration). Each framework module imports its framework;
importing ``ratekeeper`` or ``ratekeeper.integrations`` imports none.
"""
