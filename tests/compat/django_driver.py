"""Runs a one-file Django sample (it configures Django itself) in this fresh interpreter and sends
it requests: ``python -m tests.compat.django_driver`` with a JSON spec on stdin, printing one
JSON line of answers. The side-by-side tests run it twice, for the peer and for the port.

Spec: ``source`` (the app, run as ``__main__``), ``requests`` (``[method, path, form]``),
``transport`` (``client``: Django's test client; ``server``: a real waitress), ``edges``
(``[value, period]``: django-ratelimit's windows end at ``period``-aligned edges shifted per
key value; the requests start clear of them).
"""

from __future__ import annotations

import json
import sys
import time
import zlib
from typing import Any


def clear_of_edges(edges: list[tuple[str, int]], margin: float = 3.0) -> None:
    """Wait until no window of ``edges`` ends within ``margin`` seconds."""
    for _ in range(120):
        now = time.time()
        soonest = min(
            ((int(now) - int(now) % period + zlib.crc32(value.encode()) % period) - now) % period
            for value, period in edges
        )
        if soonest >= margin:
            return
        time.sleep(soonest + 0.2)


def main() -> None:
    spec = json.loads(sys.stdin.read())
    main_module = sys.modules["__main__"] = type(sys)("__main__")
    exec(compile(spec["source"], "<sample>", "exec"), main_module.__dict__)
    if spec.get("edges"):
        clear_of_edges([tuple(e) for e in spec["edges"]])
    answers: list[Any] = []
    first = last = 0.0
    if spec["transport"] == "client":
        from django.test import Client

        client = Client()
        for method, path, form in spec["requests"]:
            last = time.monotonic()
            first = first or last
            response = getattr(client, method.lower())(path, form or {})
            answers.append([response.status_code, response.content.decode()])
    else:
        import httpx
        from django.core.wsgi import get_wsgi_application

        from tests.middleware.servers import waitress_server

        with waitress_server(get_wsgi_application()) as base, httpx.Client(base_url=base) as http:
            for method, path, form in spec["requests"]:
                last = time.monotonic()
                first = first or last
                response = http.request(method, path, data=form or None)
                answers.append([response.status_code, response.text])
    last = time.monotonic()
    print(json.dumps({"answers": answers, "seconds": last - first}))


if __name__ == "__main__":
    main()
