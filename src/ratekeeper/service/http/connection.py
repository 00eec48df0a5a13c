"""One HTTP/1.1 connection of the service, owned whole: ``HttpConnection``, an asyncio protocol
on httptools' parser (llhttp). ``http.server`` accepts connections and times them.

The rules it keeps, in the order a request meets them:

- **Framing.** What llhttp refuses (Content-Length beside Transfer-Encoding, two
  Content-Lengths, bad characters, bare LF, data after ``Connection: close``), a
  Transfer-Encoding other than ``chunked``, chunked HTTP/1.0, a version other than 1.0 or 1.1,
  an HTTP/1.1 request without one Host header, a request line over ``max_head`` bytes or a
  head over it: answered with 400 (414, 431, 501, 505) and the connection closes after it,
  since the next request cannot be told apart with certainty.
- **The head, checked once complete** (``Front.check_head``: the Host and browser rules, the
  token), and a Content-Length over ``max_body``: 413. A refused request is answered in its
  turn without waiting for its body, which is dropped as it comes (timed as any body); after
  a 413, or a refusal of a request that waits for ``100 Continue``, the connection closes.
- **In order.** Requests are processed one at a time, in the order they came: the next
  starts once the one before has its answer, so a pipelined request sees every effect of
  the ones before it; answers are written in the same order. ``Expect: 100-continue`` is
  answered with ``100 Continue`` when the request's turn comes, if its head passed.
- **Two ways to answer.** A ``POST`` to a decision route (``Front.inline_paths``) is answered
  by ``Front.decide_now`` inside the protocol: at once, or when the store's batch calls back
  (``Soon``), or by one task awaiting the store. Every other request is an ASGI call
  (``http.asgi``) with its whole body (at most ``max_body`` bytes). Both give the same answer.
- **Writes.** Answers made while a read is parsed leave in one write at its end.
  Reading pauses while the transport's buffer is over its high-water mark (a client not
  reading) or ``max_pipeline`` requests wait for their answers.
- **Timers** count only the time the service waits for the client (``tick``, run by the
  server's sweep): ``idle_timeout`` for the first byte of a request, ``header_timeout`` for
  its whole head (from the connection's start or the previous answer), ``body_timeout`` for
  its body (from the end of its head), ``send_timeout`` for a client that takes nothing from
  a full buffer. While an answer is being made, no timer runs. A request cut short gets
  408 before the connection closes.
- **Ends.** A half-close (EOF) still gets the answers to every complete request, then the
  connection closes; so does ``shutdown``. A connection closed after a refusal drains what
  the client still sends for up to ``LINGER`` seconds (so the client reads the answer, not a
  reset).
"""

from __future__ import annotations

import asyncio
import logging
import re
from collections import deque
from collections.abc import Coroutine
from dataclasses import dataclass
from functools import partial
from http import HTTPStatus
from itertools import chain
from typing import Any, Protocol
from urllib.parse import unquote

import httptools

from ...errors import BadRequest
from .api import Soon
from .asgi import SERVER_ERROR, App, AsgiCall
from .body import MAX_BODY
from .guard import NOTED, Head
from .render import Answer, Response
from .request import Request

log = logging.getLogger("ratekeeper.service")
MAX_HEAD = 16 * 1024
"""Most bytes of a request line and headers (431 past them)."""


@dataclass(frozen=True, slots=True)
class HttpSettings:
    """Limits of the HTTP server; times in seconds."""

    header_timeout: float = 10.0
    """A request's head must be complete this long after the connection opened or the
    previous answer was sent."""
    body_timeout: float = 10.0
    """A request's body must be complete this long after its head."""
    idle_timeout: float = 5.0
    """A connection without a request's first byte this long after it opened or the previous
    answer was sent is closed (keep-alive)."""
    send_timeout: float = 10.0
    """A client that takes nothing from a full send buffer for this long is cut off."""
    max_connections: int = 10_000
    max_body: int = MAX_BODY
    max_head: int = MAX_HEAD
    max_pipeline: int = 64
    """Requests waiting for their answers on one connection past which reading pauses."""


class Host(Protocol):
    """What a connection uses of its server (``server.HttpServer``)."""

    app: App
    settings: HttpSettings
    front: Front | None
    loop: asyncio.AbstractEventLoop
    date: bytes

    def opened(self, conn: HttpConnection) -> None: ...

    def lost(self, conn: HttpConnection) -> None: ...

    def spawn(self, coroutine: Coroutine[Any, Any, None]) -> None: ...


STATUS_LINE = {s.value: b"HTTP/1.1 %d %s\r\n" % (s.value, s.phrase.encode()) for s in HTTPStatus}
CONTINUE = b"HTTP/1.1 100 Continue\r\n\r\n"
LINGER = 2.0
"""Seconds a connection closed after a refusal keeps reading (and dropping) what the client
still sends, so the client sees the answer before the close."""
_UNSAFE = re.compile(b"[\x00-\x08\x0a-\x1f\x7f]")
"""Bytes no header name or value may hold (a response header is checked before it is sent)."""
IDLE, HEAD, BODY = 0, 1, 2
"""What a connection waits for from its client: a request's first byte, the rest of its
head, its body."""


class Front(Protocol):
    """What the connection asks of the app beyond ASGI (``HttpApi`` provides it)."""

    inline_paths: frozenset[str]
    """Paths whose ``POST`` is answered by ``decide_now`` (empty: none)."""

    def check_head(self, method: str, path: str, head: Head) -> Response | None:
        """The refusal of a request by its head alone (counted), or None."""
        ...

    def refuse(self, exc: BadRequest) -> Response:
        """The answer to a request refused by the connection itself (counted)."""
        ...

    def decide_now(
        self,
        path: str,
        headers: list[tuple[bytes, bytes]] | None,
        body: bytes,
        block: bool,
        soon: bool,
    ) -> Answer | Soon | Coroutine[Any, Any, Response]: ...


class _Stop(Exception):
    """Raised from a parser callback to stop parsing (the reason is ``problem``)."""


class HttpConnection(asyncio.Protocol):
    """One client connection (module docstring)."""

    def __init__(self, server: Host) -> None:
        self.server = server
        settings = server.settings
        self.max_head = settings.max_head
        self.max_body = settings.max_body
        self.max_pipeline = settings.max_pipeline
        self.front = server.front
        self.inline = server.front.inline_paths if server.front is not None else frozenset()
        self.loop = server.loop
        self.parser = httptools.HttpRequestParser(self)
        self.transport: asyncio.Transport = None  # type: ignore[assignment]  # connection_made
        self.queue: deque[Request] = deque()
        """Requests whose head is complete and whose answer is not written yet, in order."""
        self.ready: deque[Request] = deque()
        """Complete requests not started yet, in order."""
        self.busy: Request | None = None
        """The request being answered (by a store's batch, a task or an ASGI call)."""
        self.request: Request | None = None
        """The request being parsed."""
        self.head_size = 0
        self.out: list[bytes] = []
        self.feeding = False
        self.stage = IDLE
        self.since = self.loop.time()
        """Since when the connection waits for the client (its stage's timer)."""
        self.stalled_since: float | None = None
        """Since when the transport's buffer is over its high-water mark."""
        self.reading = True
        self.done_reading = False
        """No request after those parsed will be read (close, EOF, error, shutdown)."""
        self.lingering = False
        self.stopping = False
        """The server is stopping: the last answer says ``connection: close``."""
        self.closed = False
        self.problem: BadRequest | None = None
        self.gone: asyncio.Future[None] | None = None

    # asyncio's protocol callbacks

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]  # a stream server's transport
        self.server.opened(self)

    def data_received(self, data: bytes) -> None:
        if self.done_reading:
            return  # a closing connection drops what still comes
        self.feeding = True
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserUpgrade:  # answered as any request, then closed:
            if self.queue:  # what follows it is not HTTP/1.1
                self.queue[-1].close = True
            self._stop_reading()
        except httptools.HttpParserError as exc:
            self._malformed(exc)
        finally:
            self.feeding = False
        self._flush()

    def eof_received(self) -> bool:
        if self.lingering:
            return False
        self._stop_reading()
        return bool(self.queue)  # answer what is complete, then close (``_flush``); or close

    def pause_writing(self) -> None:
        self.stalled_since = self.loop.time()
        self._set_reading()

    def resume_writing(self) -> None:
        self.stalled_since = None
        self._set_reading()

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        self.done_reading = True
        self.queue.clear()
        self.ready.clear()
        self.request = None
        if self.gone is not None and not self.gone.done():
            self.gone.set_result(None)
        self.server.lost(self)

    # httptools' callbacks

    def on_message_begin(self) -> None:
        self.request = Request()
        self.head_size = 0
        self.stage = HEAD

    def on_url(self, url: bytes) -> None:
        self.request.url += url  # type: ignore[union-attr]  # between begin and complete
        self.head_size += len(url)
        if self.head_size > self.max_head:
            self._stop_parsing(BadRequest("url", "the request line is too long", 414))

    def on_header(self, name: bytes, value: bytes) -> None:
        self.head_size += len(name) + len(value) + 4
        if self.head_size > self.max_head:
            self._stop_parsing(
                BadRequest("head", f"the request's head is over {self.max_head} bytes", 431)
            )
        name = name.lower()
        request: Request = self.request  # type: ignore[assignment]  # between begin and complete
        request.headers.append((name, value))
        slot = NOTED.get(name)
        if slot is not None:
            request.head.put(slot, value)

    def on_headers_complete(self) -> None:
        request: Request = self.request  # type: ignore[assignment]  # between begin and complete
        parser = self.parser
        request.method = parser.get_method().decode("ascii")
        request.version = parser.get_http_version()
        request.keep_alive = parser.should_keep_alive()
        url = request.url
        if url[:1] != b"/" and url != b"*":  # absolute-form (a proxy's): its path
            url = _origin_form(url)
        raw, _, request.query = url.partition(b"?")
        request.raw_path = raw
        text = raw.decode("latin-1")
        request.path = unquote(text) if "%" in text else text
        self.queue.append(request)
        self.stage = BODY
        self.since = self.loop.time()
        problem = _framing(request)
        if problem is not None:
            request.close = True
            self._stop_parsing(problem)
        front = self.front
        refusal: Answer | None = None
        if front is not None:
            refusal = front.check_head(request.method, request.path, request.head)
        length = request.head.content_length
        if refusal is None and length is not None and int(length) > self.max_body:
            size = f"body is {int(length)} bytes; the limit is {self.max_body}"
            refusal = self._refusal(BadRequest("body", size, 413))
        expect = request.head.expect
        request.expect = expect is not None and expect.lower() == b"100-continue"
        if refusal is not None:
            request.answer = refusal
            # its body is dropped as it comes, unless it is too big to read, or the client
            # waits for 100 Continue and may never send it: then the connection closes
            request.close = refusal[0] == 413 or request.expect

    def on_body(self, body: bytes) -> None:
        request: Request = self.request  # type: ignore[assignment]  # between begin and complete
        if request.answer is not None:
            return  # refused: its body is dropped
        request.size += len(body)
        if request.size > self.max_body:
            request.body = []
            too_big = f"body is over the limit of {self.max_body} bytes"
            request.answer = self._refusal(BadRequest("body", too_big, 413))
            request.close = True
            return
        request.body.append(body)

    def on_message_complete(self) -> None:
        request: Request = self.request  # type: ignore[assignment]  # between begin and complete
        self.request = None
        request.complete = True
        self.stage = IDLE
        if not request.keep_alive:
            self.done_reading = True  # llhttp refuses what follows; nothing more is read
            self._set_reading()
        if request.answer is None:
            self.ready.append(request)
            self._advance()

    # processing, in order

    def _advance(self) -> None:
        """Start the next requests, one at a time, while their answers come at once."""
        while self.busy is None and self.ready:
            request = self.ready.popleft()
            if request.method == "POST" and request.path in self.inline:
                body = b"".join(request.body)
                front: Front = self.front  # type: ignore[assignment]  # inline: a front
                answer = front.decide_now(request.path, None, body, True, True)
                if type(answer) is tuple:
                    request.answer = answer
                    continue
                self.busy = request
                if isinstance(answer, Soon):  # answered when the store's batch returns
                    answer.pending.future.add_done_callback(partial(self._soon, request, answer))
                else:
                    self.server.spawn(self._later(request, answer))  # type: ignore[arg-type]
                return
            self.busy = request
            self.server.spawn(AsgiCall(self, request).run(self.server.app))

    def _soon(self, request: Request, soon: Soon, _: object) -> None:
        answer = soon.answer()  # made even for a client gone: it counts, as a task would
        if answer is None:  # the batch was cancelled: the server is stopping
            self.busy = None
            if not self.closed:
                self.transport.abort()
            return
        self.answered(request, answer)

    async def _later(self, request: Request, pending: Coroutine[Any, Any, Response]) -> None:
        self.answered(request, await pending)  # decide_now's coroutine answers its own errors

    def answered(self, request: Request, answer: Answer, close: bool = False) -> None:
        """``request``'s answer is made (``close``: the connection closes after it)."""
        request.answer = answer
        request.close = request.close or close
        if self.busy is request:
            self.busy = None
        if self.closed:
            return
        self._advance()
        self._flush()

    # writing

    def _flush(self) -> None:
        """Write the answers ready at the head of the queue, in order; close when due."""
        queue = self.queue
        out = self.out
        wrote = False
        while queue:
            request = queue[0]
            answer = request.answer
            if answer is None:
                if request.expect and not (request.continued or request.complete):
                    request.continued = True
                    out.append(CONTINUE)
                break
            queue.popleft()
            wrote = True
            close = request.close or not request.keep_alive or (self.stopping and not queue)
            out.append(self._encode(request, answer, close))
            if close:
                self._write()
                self._close(linger=not request.complete or request.close)
                return
        if wrote and (not queue or queue[0] is self.request):
            self.since = self.loop.time()  # answered: the client is waited for again
        if not queue and self.done_reading and not self.lingering:
            self._write()
            self._close(linger=False)
            return
        if out and not self.feeding:
            self._write()
        self._set_reading()

    def _write(self) -> None:
        out = self.out
        if out and not self.closed:
            self.transport.write(out[0] if len(out) == 1 else b"".join(out))
        out.clear()

    def _encode(self, request: Request, answer: Answer, close: bool) -> bytes:
        status, payload, headers = answer
        if type(headers) is not bytes:
            listed: list[tuple[bytes, bytes]] = headers  # type: ignore[assignment]  # not bytes
            if _UNSAFE.search(b"\t".join(chain.from_iterable(listed))):
                log.error(
                    "a header of the answer to %s %s is invalid", request.method, request.path
                )
                status, payload, listed = SERVER_ERROR  # type: ignore[assignment]  # a list
                close = True
            headers = b"".join([b"%s: %s\r\n" % (name, value) for name, value in listed])
        if close:
            end = b"connection: close\r\n\r\n"
        elif request.version == "1.0":
            end = b"connection: keep-alive\r\n\r\n"
        else:
            end = b"\r\n"
        line = STATUS_LINE.get(status) or b"HTTP/1.1 %d \r\n" % status
        if request.method == "HEAD":
            payload = b""
        return b"".join((line, self.server.date, headers, end, payload))

    def _close(self, linger: bool) -> None:
        """Close once what is written has left; ``linger``: first read and drop what the
        client still sends, for up to ``LINGER`` seconds (so it sees the answer, not a reset)."""
        self.done_reading = True
        self.queue.clear()
        self.ready.clear()
        if self.closed:
            return
        if linger and self.transport.can_write_eof():
            self.lingering = True
            self.since = self.loop.time()
            self.transport.write_eof()
            self._set_reading()
        else:
            self.transport.close()

    def _set_reading(self) -> None:
        """Read while the client is waited for and its answers are taken (backpressure)."""
        want = self.lingering or (
            not self.done_reading
            and self.stalled_since is None
            and len(self.queue) < self.max_pipeline
        )
        if want != self.reading and not self.closed:
            self.reading = want
            if want:
                self.transport.resume_reading()
            else:
                self.transport.pause_reading()

    # refusals and ends

    def _refusal(self, exc: BadRequest) -> Answer:
        front = self.front
        if front is not None:
            return front.refuse(exc)
        payload = b'{"error":%s,"field":"%s"}' % (_json(str(exc)), exc.field.encode())
        return exc.status, payload, _json_headers(payload)

    def _stop_parsing(self, problem: BadRequest) -> None:
        self.problem = problem
        raise _Stop

    def _malformed(self, exc: httptools.HttpParserError) -> None:
        """The parser stopped: a framing error (answered, then the connection closes), or
        data after a request that closes the connection (dropped)."""
        problem, self.problem = self.problem, None
        if problem is None and self.done_reading:
            return  # data after ``Connection: close``: nothing more is read
        if problem is None:
            if isinstance(exc, httptools.HttpParserCallbackError) and exc.__context__ is not None:
                log.error("bug: serving a request raised", exc_info=exc.__context__)
                problem = BadRequest("http", "internal error", 500)
            else:
                problem = BadRequest("http", f"the request is not valid HTTP/1.1: {exc}")
        request = self.request or Request()
        self.request = None
        if not self.queue or self.queue[-1] is not request:
            self.queue.append(request)
        if request.answer is None:
            request.answer = self._refusal(problem)
        request.close = True
        self._stop_reading()

    def _stop_reading(self) -> None:
        """Read no more requests; one not complete is dropped unless refused already."""
        self.done_reading = True
        request, self.request = self.request, None
        queue = self.queue
        if request is not None and queue and queue[-1] is request and request.answer is None:
            queue.pop()  # its head came, its body never will: no answer
        self._set_reading()

    def shutdown(self) -> None:
        """Stop reading; close once the requests already complete are answered."""
        self.stopping = True
        self._stop_reading()
        if not self.queue and not self.closed:
            self.transport.close()

    def tick(self, now: float) -> None:
        """Close the connection if its client has made the service wait too long."""
        settings = self.server.settings
        if self.lingering:
            if now - self.since > LINGER:
                self.transport.abort()
            return
        stalled = self.stalled_since
        if stalled is not None:
            if now - stalled > settings.send_timeout:
                self.transport.abort()  # the client takes nothing: nothing more can leave
            return
        if not self.waiting() or self.closed:
            return  # waiting for the service, not the client
        stage = self.stage
        if stage == IDLE:
            if now - self.since > settings.idle_timeout:
                self.transport.close()
            return
        limit = settings.header_timeout if stage == HEAD else settings.body_timeout
        if now - self.since > limit:
            what = "head" if stage == HEAD else "body"
            timeout = BadRequest(what, f"the request's {what} took over {limit:g} s", 408)
            self.done_reading = True
            self.request = None
            self.queue.clear()
            self.transport.write(self._encode(Request(), self._refusal(timeout), True))
            self._close(linger=True)

    def waiting(self) -> bool:
        """Whether the connection waits for its client (no request of it is being answered)."""
        queue = self.queue
        return not queue or (queue[0] is self.request and len(queue) == 1)

    def disconnected(self) -> asyncio.Future[None]:
        """A future done when the connection is lost (an ASGI call's ``http.disconnect``)."""
        if self.gone is None:
            self.gone = self.loop.create_future()
            if self.closed:
                self.gone.set_result(None)
        return self.gone


def _framing(request: Request) -> BadRequest | None:
    """What llhttp lets through that this server refuses, or None."""
    if request.version not in ("1.1", "1.0"):
        return BadRequest("http", f"HTTP/{request.version} is not supported; use HTTP/1.1", 505)
    head = request.head
    coding = head.transfer_encoding
    if coding is not None:
        if request.version == "1.0":
            return BadRequest("http", "Transfer-Encoding is not allowed in HTTP/1.0")
        if coding.strip().lower() != b"chunked":
            return BadRequest("http", "Transfer-Encoding other than chunked is not supported", 501)
    repeated = head.repeated or ()
    if "content_length" in repeated:
        return BadRequest("http", "the request has more than one Content-Length")
    if "host" in repeated:
        return BadRequest("host", "the request has more than one Host header")
    if head.host is None and request.version == "1.1":
        return BadRequest("host", "an HTTP/1.1 request needs a Host header")
    return None


def _origin_form(url: bytes) -> bytes:
    """The path and query of an absolute-form request target (``http://host/path?q``)."""
    try:
        parsed = httptools.parse_url(url)
    except httptools.HttpParserInvalidURLError:
        return url
    path = parsed.path or b"/"
    return path + b"?" + parsed.query if parsed.query else path


def _json(text: str) -> bytes:
    import json

    return json.dumps(text).encode()


def _json_headers(payload: bytes) -> list[tuple[bytes, bytes]]:
    return [(b"content-type", b"application/json"), (b"content-length", b"%d" % len(payload))]
