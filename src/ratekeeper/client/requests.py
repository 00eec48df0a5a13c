"""requests drop-in: an ``HTTPAdapter`` that paces every request of a ``Session``.

```python
session.mount("https://", PacedAdapter())      # or PacedAdapter(pacer); "http://" too
```

Other ``HTTPAdapter`` options (``max_retries``, pool sizes) pass through; leave urllib3's
``Retry`` off (its default): the pacer's retries wait for the server's time within a retry
budget. A body that is a generator or a file is not retried. requests is imported by this
module only.
"""

from __future__ import annotations

from typing import Any

import requests
from requests.adapters import HTTPAdapter

from .flow import Answer
from .headers import header_map
from .pacer import Pacer
from .request import OWN_HEADERS, Outgoing, outgoing


def _outgoing(request: requests.PreparedRequest) -> Outgoing:
    pairs = list(request.headers.items())
    for name in OWN_HEADERS:
        request.headers.pop(name, None)
    body = request.body
    replayable = body is None or isinstance(body, bytes | str)
    size = len(body) if isinstance(body, bytes | str) else 0
    return outgoing(request.method or "GET", request.url or "", pairs, size, replayable)


def _answer(response: requests.Response) -> Answer:
    return Answer(response.status_code, header_map(response.headers.items()))


def _close(response: requests.Response) -> None:
    response.close()


class PacedAdapter(HTTPAdapter):
    """A requests transport adapter that sends each request when its budgets allow."""

    def __init__(self, pacer: Pacer | None = None, **options: Any) -> None:
        super().__init__(**options)
        self.pacer = Pacer() if pacer is None else pacer

    def send(  # type: ignore[override]  # requests' own signature, its arguments passed on
        self, request: requests.PreparedRequest, **kwargs: Any
    ) -> requests.Response:
        paced = _outgoing(request)
        send = super().send
        return self.pacer.run(paced, lambda: send(request, **kwargs), _answer, _close)
