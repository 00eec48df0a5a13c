"""httpx drop-ins: a transport that paces every request of a ``Client`` or ``AsyncClient``.

```python
client = httpx.Client(transport=PacedTransport())               # or PacedTransport(pacer)
client = httpx.AsyncClient(transport=AsyncPacedTransport())
```

``transport=`` wraps another transport (default ``httpx.HTTPTransport()`` /
``httpx.AsyncHTTPTransport()``). A request body that is not plain bytes (a generator, a
file) is never sent twice: such a request is not retried. httpx is imported by this module
only.
"""

from __future__ import annotations

import httpx

from .flow import Answer
from .headers import header_map
from .pacer import AsyncPacer, Pacer
from .request import OWN_HEADERS, Outgoing, outgoing


def _outgoing(request: httpx.Request) -> Outgoing:
    pairs = request.headers.multi_items()
    for name in OWN_HEADERS:
        if name in request.headers:
            del request.headers[name]
    replayable = isinstance(request.stream, httpx.ByteStream)
    size = request.headers.get("content-length", "0")
    body_bytes = int(size) if size.isdigit() else 0
    return outgoing(request.method, str(request.url), pairs, body_bytes, replayable)


def _answer(response: httpx.Response) -> Answer:
    return Answer(response.status_code, header_map(response.headers.multi_items()))


class PacedTransport(httpx.BaseTransport):
    """An httpx transport that sends each request when its budgets allow (``Pacer``)."""

    def __init__(
        self, pacer: Pacer | None = None, transport: httpx.BaseTransport | None = None
    ) -> None:
        self.pacer = Pacer() if pacer is None else pacer
        self.transport = httpx.HTTPTransport() if transport is None else transport

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        paced = _outgoing(request)
        return self.pacer.run(
            paced, lambda: self.transport.handle_request(request), _answer, _close
        )

    def close(self) -> None:
        self.transport.close()


def _close(response: httpx.Response) -> None:
    response.close()


class AsyncPacedTransport(httpx.AsyncBaseTransport):
    """``PacedTransport`` for ``httpx.AsyncClient`` (``AsyncPacer``)."""

    def __init__(
        self, pacer: AsyncPacer | None = None, transport: httpx.AsyncBaseTransport | None = None
    ) -> None:
        self.pacer = AsyncPacer() if pacer is None else pacer
        self.transport = httpx.AsyncHTTPTransport() if transport is None else transport

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        paced = _outgoing(request)
        return await self.pacer.run(
            paced, lambda: self.transport.handle_async_request(request), _answer, _aclose
        )

    async def aclose(self) -> None:
        await self.transport.aclose()


async def _aclose(response: httpx.Response) -> None:
    await response.aclose()
