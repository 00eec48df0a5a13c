"""The service's HTTP face: everything between a socket and the ``Engine``.

- ``server``: the listening socket, connection count and timers, graceful stop;
  ``connection``: one HTTP/1.1 connection (httptools); ``asgi``: a request handed to an ASGI app;
  ``request``: one request on a connection;
- ``guard``: what is checked in a request's head before its body is read (browser rules);
- ``api``: the routes of the JSON API (``HttpApi``): parse a request, ask the ``Engine``,
  render its answer; ``hit``: ``POST /v1/hit``'s body and response, rendered from an outcome;
- ``nested``: ``/v1/hit`` with ``levels``, ``/v1/reserve``, ``/v1/settle``, ``/v1/cancel``;
- ``quotas``: the quota routes (status, admin operations);
- ``dashboard``: ``/dashboard`` and its data; ``openapi.json``: the API's document.

Imports nothing, so that its modules load one by one.
"""
