"""The decision routes answered inside the HTTP protocol, without an ASGI task per request.

uvicorn serves a request by creating an asyncio task that runs the ASGI app, which receives
the body and sends the response as two messages, each header checked by a regular expression.
For an empty route that is most of a request's cost; for ``POST /v1/hit`` on an in-process
store it is more than the decision. ``inline_protocol`` extends uvicorn's httptools protocol
so that a ``POST`` to a decision route is held until its body is complete and then answered
from the protocol's callback by ``HttpApi.decide_now`` (the same function the ASGI app calls,
so both answer byte for byte the same): one write, no task. When the store must be asked, one
task awaits the answer and writes it; no ASGI messages.

Everything else goes uvicorn's way, and so does a decision request the protocol should not
answer itself: ``Expect: 100-continue``, a body over ``MAX_BODY`` (the ASGI path refuses it),
or a client that is not reading its responses (uvicorn's send waits for the
buffer to drain; so does the next request, queued behind it). Keep-alive, ``Connection:
close``, pipelining, disconnects and graceful shutdown use uvicorn's own per-request state
(``RequestResponseCycle``), so its bookkeeping holds. uvicorn versions without the hook this
needs (``_start_asgi_task``) serve every request the ASGI way.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Awaitable, Coroutine
from functools import partial
from itertools import chain
from typing import Any, Protocol

from uvicorn.protocols.http import httptools_impl
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol
from uvicorn.protocols.utils import get_client_addr, get_path_with_query_string

from .http import MAX_BODY, Answer, Response, Soon

log = logging.getLogger("ratekeeper.service")

_STATUS_LINE: dict[int, bytes] | None = getattr(httptools_impl, "STATUS_LINE", None)
SUPPORTED = _STATUS_LINE is not None and hasattr(HttpToolsProtocol, "_start_asgi_task")
"""Whether this uvicorn has what ``inline_protocol`` hooks into."""
_UNSAFE = re.compile(b"[\x00-\x08\x0a-\x1f\x7f]")
"""Bytes no header name or value may hold (uvicorn's own check, run once per response)."""
_SERVER_ERROR = (
    b"HTTP/1.1 500 Internal Server Error\r\ncontent-type: text/plain; charset=utf-8\r\n"
    b"content-length: 21\r\nconnection: close\r\n\r\nInternal Server Error"
)


class Decider(Protocol):
    """What the protocol needs of the app: ``HttpApi`` provides it."""

    inline_paths: frozenset[str]

    def decide_now(
        self,
        path: str,
        headers: list[tuple[bytes, bytes]] | None,
        body: bytes,
        block: bool,
        soon: bool,
    ) -> Answer | Soon | Coroutine[Any, Any, Response]: ...


def inline_protocol(base: type[HttpToolsProtocol], app: Any) -> type[HttpToolsProtocol]:
    """``base`` answering ``app``'s decision routes itself (module docstring); ``base`` as it
    is when ``app`` has no ``decide_now`` or this uvicorn lacks the hook."""
    if not SUPPORTED or not hasattr(app, "decide_now"):
        return base
    decider: Decider = app
    paths = decider.inline_paths
    decide = decider.decide_now
    status_line: dict[int, bytes] = _STATUS_LINE  # type: ignore[assignment]  # SUPPORTED
    defaults: list[Any] = [None, b""]
    """uvicorn's default headers (``server``, ``date``: a new list every second) as lines."""

    class InlineProtocol(base):  # type: ignore[valid-type,misc]  # a class made at run time
        held: Any = None
        """The request whose body is awaited before it is answered here (a uvicorn cycle)."""
        held_app: Any = None

        def _start_asgi_task(self, cycle: Any, asgi: Any) -> None:
            scope = cycle.scope
            if (
                scope["method"] == "POST"
                and scope["path"] in paths
                and not cycle.waiting_for_100_continue
            ):
                if cycle.more_body:
                    self.held, self.held_app = cycle, asgi
                else:  # a pipelined request, its body read while the one before was served
                    self._answer(cycle, asgi)
                return
            super()._start_asgi_task(cycle, asgi)

        def on_body(self, body: bytes) -> None:
            super().on_body(body)
            held = self.held
            if held is not None and len(held.body) > MAX_BODY:  # the ASGI path refuses it
                self.held = None
                super()._start_asgi_task(held, self.held_app)

        def on_message_complete(self) -> None:
            super().on_message_complete()
            held = self.held
            if held is not None and not held.more_body:
                self.held = None
                self._answer(held, self.held_app)

        def connection_lost(self, exc: Exception | None) -> None:
            self.held = None
            super().connection_lost(exc)

        def _answer(self, cycle: Any, asgi: Any) -> None:
            if self.flow.write_paused:  # the client is not reading: wait the ASGI way
                super()._start_asgi_task(cycle, asgi)
                return
            scope = cycle.scope
            answer = decide(scope["path"], scope["headers"], bytes(cycle.body), True, True)
            if isinstance(answer, tuple):
                self._send(cycle, answer)
            elif isinstance(answer, Soon):  # in the store's batch: answered when it returns
                answer.pending.future.add_done_callback(partial(self._answered, cycle, answer))
            else:
                self._start(self._send_later(cycle, answer))

        def _answered(self, cycle: Any, soon: Soon, _: object) -> None:
            answer = soon.answer()  # made even for a client gone: it counts, as a task would
            if answer is None or cycle.disconnected:
                return
            if self.flow.write_paused:  # the client stopped reading meanwhile
                self._start(self._send_later(cycle, _ready(answer)))
            else:
                self._send(cycle, answer)

        def _start(self, coroutine: Coroutine[Any, Any, None]) -> None:
            """A task uvicorn waits for at shutdown (``tasks``), as it waits for its own."""
            task = self.loop.create_task(coroutine)
            task.add_done_callback(self.tasks.discard)
            self.tasks.add(task)

        async def _send_later(self, cycle: Any, pending: Awaitable[Answer]) -> None:
            answer = await pending
            if self.flow.write_paused and not cycle.disconnected:
                await self.flow.drain()
            if not cycle.disconnected:
                self._send(cycle, answer)

        def _send(self, cycle: Any, answer: Answer) -> None:
            """The whole response in one write, then uvicorn's end-of-response bookkeeping."""
            status, payload, headers = answer
            if cycle.access_log:  # as uvicorn logs it
                scope = cycle.scope
                self.access_logger.info(
                    '%s - "%s %s HTTP/%s" %d', get_client_addr(scope), scope["method"],
                    get_path_with_query_string(scope), scope["http_version"], status,
                )  # fmt: skip
            default = cycle.default_headers
            if default is not defaults[0]:
                defaults[1] = _lines(default)
                defaults[0] = default
            lines: bytes | None
            if isinstance(headers, bytes):  # made by ``decide_now`` from checked parts
                lines = headers
            elif _UNSAFE.search(b"\t".join(chain.from_iterable(headers))):  # as uvicorn checks
                log.error("a header of the answer to POST %s is invalid", cycle.scope["path"])
                lines = None
            else:
                lines = _lines(headers)
            if lines is None:
                cycle.keep_alive = False
                data = _SERVER_ERROR
            else:
                close = b"" if cycle.keep_alive else b"connection: close\r\n"
                head = status_line[status] + defaults[1]
                data = b"".join((head, lines, close, b"\r\n", payload))
            cycle.response_started = True
            cycle.response_complete = True
            self.transport.write(data)
            cycle.message_event.set()
            if not cycle.keep_alive:
                self.transport.close()
            cycle.on_response()

    return InlineProtocol


async def _ready(answer: Answer) -> Answer:
    """``answer`` as an awaitable (``_send_later`` waits for the client first)."""
    return answer


def _lines(headers: list[tuple[bytes, bytes]]) -> bytes:
    """Headers as HTTP/1.1 sends them: ``name: value\\r\\n`` each."""
    return b"".join([b"%s: %s\r\n" % (name, value) for name, value in headers])
