"""Drop-ins for the peers: an app written for slowapi, Flask-Limiter, django-ratelimit or Django
REST framework's throttles switches to ratekeeper by changing its imports.

- ``slowapi``: ``Limiter``, ``get_remote_address``, ``RateLimitExceeded``,
  ``_rate_limit_exceeded_handler``, ``SlowAPIMiddleware`` — onto the FastAPI integration;
- ``flask_limiter``: ``Limiter``, ``get_remote_address``, ``RateLimitExceeded``, ``Limit``,
  ``RATELIMIT_*`` settings — onto the Flask integration;
- ``django_ratelimit``: ``ratelimit``, ``is_ratelimited``, ``get_usage``, ``Ratelimited``,
  ``RatelimitMiddleware``, ``ALL``/``UNSAFE`` — onto the Django integration;
- ``drf``: ``SimpleRateThrottle``, ``AnonRateThrottle``, ``UserRateThrottle``,
  ``ScopedRateThrottle`` — onto the DRF throttles.

Each is a map, not a second limiter: it translates the peer's names, signatures and settings
into the integration's, and holds no rule of its own. What the integration cannot do as the peer
documents it is refused when the app is set up (``ConfigError``, naming ratekeeper's
equivalent), never accepted and ignored. ``limits_syntax`` holds what slowapi and Flask-Limiter
share: the ``limits`` library's rate strings, strategy names and storage URIs.

Importing ``ratekeeper.compat`` imports no framework; each module imports its own.
"""
