"""Loopback HTTP servers that limit like real APIs, for the client's tests.

Each dialect decides with a ratekeeper ``Limiter`` on the test's clock (a ``ManualClock`` the
client's ``sleep`` moves) and answers in its own headers:

- ``ietf``: ratekeeper's own ``Decision.headers()`` (``RateLimit-Policy``, ``RateLimit``,
  ``X-RateLimit-*``, ``Retry-After``), any algorithm;
- ``github``: ``X-RateLimit-Limit/-Remaining/-Reset`` (epoch)/``-Used``/``-Resource``, a fixed
  window, 429 with the same headers when spent;
- ``openai``: ``x-ratelimit-*-requests`` and ``-tokens`` (Go durations), two token buckets;
  a request's actual tokens come in ``X-Test-Tokens``;
- ``retry_after``: nothing on success, ``Retry-After`` (seconds) on a 429.

Every answer is recorded (``Served.log``: time, path, status) for the tests to count.
"""

from __future__ import annotations

import math
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from ratekeeper import Limiter, ManualClock, MemoryStore

Reply = tuple[int, dict[str, str]]
Dialect = Callable[[str, dict[str, str]], Reply]


@dataclass
class Served:
    url: str
    log: list[tuple[float, str, int]] = field(default_factory=list)

    def statuses(self) -> list[int]:
        return [status for _, _, status in self.log]


def _go_duration(seconds: float) -> str:
    """Seconds as OpenAI writes them: ``1m30s``, ``12.5s``, ``200ms``."""
    if seconds < 1:
        return f"{max(0, math.ceil(seconds * 1000))}ms"
    minutes, rest = divmod(seconds, 60)
    text = f"{rest:.3f}".rstrip("0").rstrip(".") + "s"
    return f"{int(minutes)}m{text}" if minutes else text


def ietf(clock: Callable[[], float], rate: str, algorithm: str = "fixed_window") -> Dialect:
    limiter = Limiter(MemoryStore(), clock=clock)

    def answer(path: str, headers: dict[str, str]) -> Reply:
        d = limiter.hit("key", rate, algorithm=algorithm)
        return (200 if d.allowed else 429), d.headers()

    return answer


def github(clock: ManualClock, limit: int, window: int) -> Dialect:
    limiter = Limiter(MemoryStore(), clock=clock)
    rate = f"{limit}/{window}s"

    def answer(path: str, headers: dict[str, str]) -> Reply:
        d = limiter.hit("key", rate)
        out = {
            "X-RateLimit-Limit": str(d.limit),
            "X-RateLimit-Remaining": str(d.remaining),
            "X-RateLimit-Reset": str(math.ceil(d.reset_at)),
            "X-RateLimit-Used": str(d.limit - d.remaining),
            "X-RateLimit-Resource": "core",
        }
        return (200 if d.allowed else 429), out

    return answer


def openai(clock: ManualClock, requests: int, tokens: int, window: int) -> Dialect:
    limiter = Limiter(MemoryStore(), clock=clock)
    by_requests, by_tokens = f"{requests}/{window}s", f"{tokens}/{window}s"

    def answer(path: str, headers: dict[str, str]) -> Reply:
        used = int(headers.get("x-test-tokens", "0"))
        r = limiter.hit("requests", by_requests, algorithm="token_bucket")
        ok = r.allowed
        if ok:
            t = limiter.hit("tokens", by_tokens, algorithm="token_bucket", cost=max(used, 1))
            if not t.allowed:
                limiter.refund("requests", by_requests, algorithm="token_bucket")
                ok = False
        r = limiter.peek("requests", by_requests, algorithm="token_bucket", cost=0)
        t = limiter.peek("tokens", by_tokens, algorithm="token_bucket", cost=0)
        out = {}
        for unit, d in (("requests", r), ("tokens", t)):
            out[f"x-ratelimit-limit-{unit}"] = str(d.limit)
            out[f"x-ratelimit-remaining-{unit}"] = str(d.remaining)
            out[f"x-ratelimit-reset-{unit}"] = _go_duration(d.reset_at - d.now)
        return (200 if ok else 429), out

    return answer


def retry_after(clock: ManualClock, limit: int, window: int) -> Dialect:
    limiter = Limiter(MemoryStore(), clock=clock)
    rate = f"{limit}/{window}s"

    def answer(path: str, headers: dict[str, str]) -> Reply:
        d = limiter.hit("key", rate)
        if d.allowed:
            return 200, {}
        return 429, {"Retry-After": str(max(1, math.ceil(d.retry_after)))}

    return answer


@contextmanager
def serving(dialect: Dialect, clock: Callable[[], float]) -> Iterator[Served]:
    """A threaded HTTP/1.1 server on a free loopback port answering with ``dialect``."""
    lock = threading.Lock()
    served: Served

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def _answer(self) -> None:
            size = int(self.headers.get("content-length") or 0)
            if size:
                self.rfile.read(size)
            elif self.headers.get("transfer-encoding", "").lower() == "chunked":
                while True:  # a body of unknown length: read it all, or the next request breaks
                    length = int(self.rfile.readline().split(b";")[0], 16)
                    self.rfile.read(length + 2)
                    if length == 0:
                        break
            headers = {k.lower(): v for k, v in self.headers.items()}
            with lock:
                status, out = dialect(self.path, headers)
                served.log.append((clock(), self.path, status))
            body = b"{}"
            self.send_response(status)
            for name, value in out.items():
                self.send_header(name, value)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        do_GET = do_POST = do_PUT = _answer

        def log_message(self, format: str, *args: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    server.daemon_threads = True
    served = Served(f"http://127.0.0.1:{server.server_address[1]}")
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05})
    thread.start()
    try:
        yield served
    finally:
        server.shutdown()
        server.server_close()
        thread.join()
