"""Real HTTP servers on 127.0.0.1 in a thread: uvicorn for ASGI apps, wsgiref and waitress for
WSGI apps."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from socketserver import ThreadingMixIn
from typing import Any
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer, make_server

import uvicorn


@contextmanager
def uvicorn_server(app: Any) -> Iterator[str]:
    """Serve ``app`` with uvicorn on a free loopback port; yields the base URL."""
    config = uvicorn.Config(app, host="127.0.0.1", port=0, log_level="warning", lifespan="off")
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 20
    while not server.started:
        if time.monotonic() > deadline or not thread.is_alive():
            raise RuntimeError("uvicorn did not start")
        time.sleep(0.01)
    port = server.servers[0].sockets[0].getsockname()[1]
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(timeout=20)


class _ThreadingWSGIServer(ThreadingMixIn, WSGIServer):
    daemon_threads = True


class _QuietHandler(WSGIRequestHandler):
    def log_message(self, format: str, *args: Any) -> None:
        pass


@contextmanager
def wsgi_server(app: Callable[..., Any]) -> Iterator[str]:
    """Serve ``app`` with wsgiref (one thread per request) on a free loopback port."""
    server = make_server(
        "127.0.0.1", 0, app, server_class=_ThreadingWSGIServer, handler_class=_QuietHandler
    )
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05})
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_port}"
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=20)


@contextmanager
def waitress_server(app: Callable[..., Any], threads: int = 8) -> Iterator[str]:
    """Serve ``app`` with waitress (a production WSGI server, ``threads`` workers) on a free
    loopback port; yields the base URL."""
    from waitress import wasyncore
    from waitress.server import create_server

    server = create_server(app, host="127.0.0.1", port=0, threads=threads)
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.effective_port}"
    finally:
        # closed in the loop's own thread (waitress runs a thunk there): closing its sockets
        # from this thread would let the loop's select() see a closed descriptor (EBADF)
        server.trigger.pull_trigger(lambda: wasyncore.close_all(server._map))
        thread.join(timeout=20)
        server.task_dispatcher.shutdown()


def wait_until(condition: Callable[[], bool], timeout: float = 10.0) -> bool:
    """Poll ``condition`` until true (server-side work after a client hangs up), bounded."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if condition():
            return True
        time.sleep(0.01)
    return condition()
