"""aiohttp drop-in: a client middleware (aiohttp 3.12 and later) that paces every request.

```python
session = aiohttp.ClientSession(middlewares=[PacedMiddleware()])   # or PacedMiddleware(pacer)
```

A retry calls the next handler again with the same request (aiohttp's documented way); a
body that aiohttp cannot send twice (a stream, an async generator) is not retried. aiohttp
is imported by this module only.
"""

from __future__ import annotations

import aiohttp
from aiohttp import payload

from .flow import Answer
from .headers import header_map
from .pacer import AsyncPacer
from .request import OWN_HEADERS, Outgoing, outgoing

Handler = aiohttp.ClientHandlerType


def _outgoing(request: aiohttp.ClientRequest) -> Outgoing:
    pairs = list(request.headers.items())
    for name in OWN_HEADERS:
        request.headers.popall(name, None)
    body = request.body
    replayable = body == b"" or isinstance(body, payload.BytesPayload)
    size = body.size if isinstance(body, payload.BytesPayload) else 0
    return outgoing(request.method, str(request.url), pairs, size or 0, replayable)


def _answer(response: aiohttp.ClientResponse) -> Answer:
    return Answer(response.status, header_map(response.headers.items()))


async def _release(response: aiohttp.ClientResponse) -> None:
    response.release()


class PacedMiddleware:
    """An aiohttp client middleware that sends each request when its budgets allow."""

    def __init__(self, pacer: AsyncPacer | None = None) -> None:
        self.pacer = AsyncPacer() if pacer is None else pacer

    async def __call__(
        self, request: aiohttp.ClientRequest, handler: Handler
    ) -> aiohttp.ClientResponse:
        paced = _outgoing(request)
        return await self.pacer.run(paced, lambda: handler(request), _answer, _release)
