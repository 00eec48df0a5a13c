"""The gateway's side towards the provider: one HTTP client (httpx), streaming.

``Upstream`` sends a request to the provider's base URL and hands back the response before
its body is read, so the body can be streamed through. What it changes on the way:

- request headers: the hop-by-hop ones, ``host``, ``content-length``, and the client's own
  credentials (``authorization``, ``x-api-key``, ``cookie``: the gateway's keys, never the
  provider's) are dropped; ``accept-encoding: identity`` is asked for, so the gateway reads
  the usage in plain text; ``headers`` (the provider's key, ``anthropic-version``...) are
  added;
- response headers: the hop-by-hop ones, ``content-length`` and ``content-encoding`` (the
  body is passed on decoded, chunked) and the provider's own rate limit headers (the
  gateway's own limits replace them) are dropped.

httpx is imported when the first client is made (``pip install ratekeeper[llm]``), so
``import ratekeeper.llm`` needs nothing beyond ratekeeper. One client is kept per event loop.
"""

from __future__ import annotations

import asyncio
import re
from collections.abc import AsyncIterator, Iterable, Mapping
from typing import Any

HOP = frozenset({
    "connection", "keep-alive", "proxy-authenticate", "proxy-authorization", "te", "trailer",
    "transfer-encoding", "upgrade",
})  # fmt: skip
_REQUEST_DROPS = HOP | {"host", "content-length", "authorization", "x-api-key", "cookie",
                        "accept-encoding", "expect"}  # fmt: skip
_RESPONSE_DROPS = HOP | {"content-length", "content-encoding", "date", "server", "retry-after",
                         "retry-after-ms", "x-should-retry", "ratelimit",
                         "ratelimit-policy"}  # fmt: skip
_TOKEN = re.compile(r"[!#$%&'*+.^_`|~0-9A-Za-z-]+")
_VALUE = re.compile(r"[^\s\x00-\x1f\x7f](?:[^\x00-\x1f\x7f]*[^\s\x00-\x1f\x7f])?")
_RESPONSE_PREFIXES = ("x-ratelimit-", "anthropic-ratelimit-")


class UpstreamError(Exception):
    """The provider could not be reached or did not answer in time (the client's 502/504)."""

    def __init__(self, message: str, timeout: bool = False) -> None:
        super().__init__(message)
        self.timeout = timeout


class Response:
    """The provider's answer: status, the headers passed on, and the body to stream."""

    def __init__(self, raw: Any) -> None:
        self.raw = raw
        self.status: int = raw.status_code
        self.headers = [
            (k, v)
            for k, v in raw.headers.multi_items()
            if k.lower() not in _RESPONSE_DROPS and not k.lower().startswith(_RESPONSE_PREFIXES)
        ]
        self.streams = raw.headers.get("content-type", "").startswith("text/event-stream")

    def body(self) -> AsyncIterator[bytes]:
        """The body's chunks as they arrive (decoded)."""
        chunks: AsyncIterator[bytes] = self.raw.aiter_bytes()
        return chunks

    async def aclose(self) -> None:
        """Stop reading: the connection goes back to the pool, or is closed."""
        await self.raw.aclose()


class Upstream:
    """A streaming client of one provider base URL (module docstring)."""

    def __init__(
        self,
        url: str,
        headers: Mapping[str, str] | None = None,
        *,
        connect_timeout: float = 10.0,
        read_timeout: float = 120.0,
        max_connections: int = 1000,
        transport: Any = None,
    ) -> None:
        if not isinstance(url, str) or not url.startswith(("http://", "https://")):
            raise ValueError(f"upstream {url!r} is invalid; expected an http:// or https:// URL")
        self.url = url.rstrip("/")
        self.headers = {k.lower(): v for k, v in (headers or {}).items()}
        for name, value in self.headers.items():
            if (
                not _TOKEN.fullmatch(name)
                or not isinstance(value, str)
                or not _VALUE.fullmatch(value)
            ):
                raise ValueError(
                    f"upstream header {name!r}: {value!r} is not a valid header "
                    "(no spaces around it, no line breaks)"
                )
        self.connect_timeout = connect_timeout
        self.read_timeout = read_timeout
        self.max_connections = max_connections
        self.transport = transport
        self._clients: dict[asyncio.AbstractEventLoop, Any] = {}

    def _client(self) -> Any:
        loop = asyncio.get_running_loop()
        client = self._clients.get(loop)
        if client is None:
            import httpx  # the llm extra: only when a gateway first calls out

            for old in [k for k in self._clients if k.is_closed()]:
                del self._clients[old]
            timeout = httpx.Timeout(self.read_timeout, connect=self.connect_timeout)
            limits = httpx.Limits(
                max_connections=self.max_connections,
                max_keepalive_connections=min(100, self.max_connections),
            )
            client = httpx.AsyncClient(timeout=timeout, limits=limits, transport=self.transport,
                                       trust_env=False)  # fmt: skip
            self._clients[loop] = client
        return client

    async def send(
        self, method: str, path: str, query: str, headers: Iterable[tuple[str, str]], body: bytes
    ) -> Response:
        """Send the request; the response's body is not read yet. ``UpstreamError`` when
        the provider cannot be reached or sends no answer in time."""
        import httpx

        client = self._client()
        sent = [(k, v) for k, v in headers if k.lower() not in _REQUEST_DROPS]
        sent = [(k, v) for k, v in sent if k.lower() not in self.headers]
        sent += [*self.headers.items(), ("accept-encoding", "identity")]
        url = self.url + path + (f"?{query}" if query else "")
        try:
            request = client.build_request(method, url, headers=sent, content=body)
            raw = await client.send(request, stream=True)
        except httpx.TimeoutException as exc:
            raise UpstreamError(f"the upstream did not answer in time: {exc!r}", True) from exc
        except (httpx.HTTPError, OSError) as exc:
            raise UpstreamError(f"the upstream could not be reached: {exc!r}") from exc
        return Response(raw)

    async def aclose(self) -> None:
        """Close this event loop's client."""
        loop = asyncio.get_running_loop()
        client = self._clients.pop(loop, None)
        if client is not None:
            await client.aclose()
