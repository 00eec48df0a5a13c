"""One HTTP request on a connection of the service's own server, from its first byte to its
answer being written (``connection`` fills it, ``asgi`` hands it to an app)."""

from __future__ import annotations

from .guard import Head
from .render import Answer


class Request:
    """One request on a connection, from its first byte to its answer being written."""

    __slots__ = (
        "answer", "body", "close", "complete", "continued", "expect", "head", "headers",
        "keep_alive", "method", "path", "query", "raw_path", "size", "url", "version",
    )  # fmt: skip

    def __init__(self) -> None:
        self.url = b""
        self.headers: list[tuple[bytes, bytes]] = []
        self.head = Head()
        self.body: list[bytes] = []
        self.size = 0
        self.method = ""
        self.path = ""
        self.raw_path = b""
        self.query = b""
        self.version = "1.1"
        self.keep_alive = True
        self.complete = False
        """Its whole body has arrived."""
        self.expect = False
        """It asked for ``100 Continue``."""
        self.continued = False
        self.close = False
        """The connection closes after its answer (a framing error)."""
        self.answer: Answer | None = None
